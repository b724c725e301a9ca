mps-bench run --modes mps,mps-transparent --rounds 3 --scale 10 --clients 1,16 --workloads rtt,launch-rate,tiny,infer,infer-graph --requests 5000
