mps-bench run --modes mps,mps-unbatched --rounds 2 --clients 8,16 --workloads infer --requests 2000
