mps-bench run --modes native,mps,mps-unbatched --rounds 3 --scale 10 --clients 1 --workloads rtt,launch-rate,tiny
