mps-bench run --modes native,mps --rounds 5 --scale 10 --clients 1 --workloads rtt,launch-rate,tiny
