mps-bench run --modes nvidia-mps,one-context,mps,mps-unbatched --rounds 3 --scale 10 --clients 8 --workloads spin
