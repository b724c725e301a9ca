mps-bench run --modes nvidia-mps,one-context,mps --rounds 3 --clients 8,16 --workloads infer,infer-graph --requests 5000
