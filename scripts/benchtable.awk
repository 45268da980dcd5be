# Turns `go test -bench` output of internal/lockkit/lockbench into tables:
# uncontended cycles/s with the ratio to the server's raw round trip, and
# the contended figures per subject.
/^Benchmark(Uncontended|Contended)\// {
  name = $1; sub(/-[0-9]+$/, "", name)
  n = split(name, part, "/")
  kind = part[1]; group = part[2]; subject = part[3]
  for (i = 5; i < NF; i += 2) metric[name, $(i+1)] = $i
  if (kind == "BenchmarkUncontended") {
    if (subject == "raw-roundtrip") base[group] = metric[name, "cycles/s"]
    un[++nu] = name; ugroup[name] = group; usubj[name] = subject
  } else {
    co[++nc] = name; cgroup[name] = group; csubj[name] = subject
  }
}
END {
  if (nu) {
    print "\nUncontended (one goroutine, acquire + release on a free key)\n"
    print "| server | subject | cycles/s | x raw round trip |"
    print "|---|---|---:|---:|"
    for (i = 1; i <= nu; i++) {
      k = un[i]; g = ugroup[k]; c = metric[k, "cycles/s"]
      printf "| %s | %s | %.0f | %.2f |\n", g, usubj[k], c, (base[g] ? c / base[g] : 0)
    }
  }
  if (nc) {
    print "\nContended (32 goroutines loop acquire / 1 ms critical section / release on one key)\n"
    print "| server | subject | cycles/s | p50 wait ms | p99 wait ms | max wait ms | gave up | fairness (Jain) | ideal-queue p99 ms |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= nc; i++) {
      k = co[i]
      printf "| %s | %s | %.0f | %.1f | %.1f | %.1f | %d | %.3f | %.1f |\n", cgroup[k], csubj[k],
        metric[k, "cycles/s"], metric[k, "p50-ms"], metric[k, "p99-ms"], metric[k, "max-ms"],
        metric[k, "gaveup"], metric[k, "fairness"], metric[k, "ideal-p99-ms"]
    }
  }
}
