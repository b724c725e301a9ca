mps-bench run --modes native,nvidia-mps,one-context,mps,mps-unbatched --rounds 2 --scale 2 --requests 1000 --clients 1,8,16 --workloads rtt,launch-rate,infer,infer-graph
