mps-bench run --modes mps,mps-transparent --rounds 7 --scale 10 --clients 1,16 --workloads tiny,infer --requests 5000
