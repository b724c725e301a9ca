mps-bench run --modes mps --clients 128 --workloads tiny,infer --requests 500
