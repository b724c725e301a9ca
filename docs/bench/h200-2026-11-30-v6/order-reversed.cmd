mps-bench run --modes mps-unbatched,mps --rounds 9 --clients 1 --workloads infer-vary,infer-pairs --requests 600
