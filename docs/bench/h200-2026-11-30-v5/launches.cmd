mps-bench run --modes native,nvidia-mps,one-context,mps,mps-unbatched --rounds 2 --scale 2 --clients 1,8,16,32 --workloads spin,tiny
