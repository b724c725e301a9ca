mps-bench run --modes native,mps --rounds 3 --scale 10 --clients 1 --workloads rtt
