mps-bench run --modes mps,mps-unbatched --rounds 9 --clients 1,16 --workloads infer-vary --requests 600
