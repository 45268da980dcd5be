# Turns `go test -bench` output of internal/lockkit/lockbench into tables:
# uncontended cycles/s with the ratio to the server's raw round trip, and
# the contended figures per subject.
/^Benchmark(Uncontended|Contended)\// {
  name = $1; sub(/-[0-9]+$/, "", name)
  n = split(name, part, "/")
  kind = part[1]; group = part[2]; subject = part[3]
  for (i = 5; i < NF; i += 2) metric[name, $(i+1)] = $i
  if (kind == "BenchmarkUncontended") {
    # Repeated runs (-count) of one subject: keep every figure, report the
    # median, so one noisy second on a shared machine does not decide.
    if (!((name) in runs)) { un[++nu] = name; ugroup[name] = group; usubj[name] = subject }
    runs[name]++; samples[name, runs[name]] = metric[name, "cycles/s"]
  } else {
    co[++nc] = name; cgroup[name] = group; csubj[name] = subject
  }
}
function median(name,    n, i, j, t, v) {
  n = runs[name]
  for (i = 1; i <= n; i++) v[i] = samples[name, i] + 0
  for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
  return (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
}
END {
  if (nu) {
    for (i = 1; i <= nu; i++) { k = un[i]; med[k] = median(k); if (usubj[k] == "raw-roundtrip") base[ugroup[k]] = med[k] }
    print "\nUncontended (one goroutine, acquire + release on a free key; median of " runs[un[1]] " runs)\n"
    print "| server | subject | cycles/s | x raw round trip | x peer |"
    print "|---|---|---:|---:|---:|"
    for (i = 1; i <= nu; i++) {
      k = un[i]; g = ugroup[k]; c = med[k]
      # The peer is the first subject of the group that is not ours.
      if (!(g in peer) && usubj[k] != "raw-roundtrip" && usubj[k] !~ /^shop-/) peer[g] = c
    }
    for (i = 1; i <= nu; i++) {
      k = un[i]; g = ugroup[k]; c = med[k]
      printf "| %s | %s | %.0f | %.2f | %s |\n", g, usubj[k], c, (base[g] ? c / base[g] : 0), \
        ((g in peer) && usubj[k] != "raw-roundtrip" ? sprintf("%.2f", c / peer[g]) : "")
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
