mps-bench run --modes mps,mps-unbatched --rounds 5 --clients 1,16 --workloads infer-pairs --requests 1000
