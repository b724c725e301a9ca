mps-bench run --modes nvidia-mps,one-context,mps --rounds 3 --scale 10 --clients 8,16,32 --workloads spin,tiny
