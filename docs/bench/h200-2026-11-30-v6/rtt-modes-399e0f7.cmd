mps-bench run --modes native,mps,mps-unbatched --rounds 7 --scale 10 --clients 1 --workloads rtt
