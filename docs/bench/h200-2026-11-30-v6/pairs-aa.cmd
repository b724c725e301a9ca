mps-bench run --modes mps,mps-batched --rounds 5 --clients 1 --workloads infer-pairs --requests 1000
