# Turns the output of `make bench` (rounds of `go test -bench` on
# internal/lockkit/lockbench, each round preceded by a "round N" line) into
# one table per kind.
#
# Every round runs every subject once, so A B A B ...: a drift of the
# machine's speed lands on both sides of a ratio. Each ratio is therefore
# taken inside a round (subject / peer, subject / raw round trip, the same
# minute on the same machine), and the table shows per row the median of
# the per-round ratios and their range (min-max), never a ratio of medians.
/^round [0-9]+/ { round = $2; rounds = (round > rounds ? round : rounds); next }
/^Benchmark(Uncontended|Contended)\// {
  name = $1; sub(/-[0-9]+$/, "", name)
  split(name, part, "/")
  kind = (part[1] == "BenchmarkUncontended") ? "u" : "c"; group = part[2]; subject = part[3]
  delete m
  for (i = 3; i < NF; i += 2) m[$(i+1)] = $i
  key = kind SUBSEP group SUBSEP subject
  if (!(key in seen)) { seen[key] = 1; order[kind, ++n[kind]] = key; kgroup[key] = group; ksubj[key] = subject }
  for (metric in m) v[key, metric, round] = m[metric]
}
# The peer is the first subject of a group that is not shop's own.
function peerOf(kind, group,    i, k) {
  for (i = 1; i <= n[kind]; i++) {
    k = order[kind, i]
    if (kgroup[k] == group && ksubj[k] != "raw-roundtrip" && ksubj[k] !~ /^shop-/) return k
  }
  return ""
}
# Per-round ratios of (a's metric) x fa / (b's metric) x fb over the rounds
# both ran; sets med, lo, hi, cnt.
function ratios(a, ma, b, mb, mode,    r, x, y, c, s, i, j, t) {
  c = 0
  for (r = 1; r <= rounds; r++) {
    if (!((a, ma, r) in v)) continue
    x = v[a, ma, r] + 0
    if (mode == "ideal") {
      # Throughput beside 1 / (critical section + 2 round trips); the
      # ideal queue's p99 is (N - 1) of those, N = 32.
      y = v[a, "ideal-p99-ms", r] / 31 / 1000
      if (y <= 0) continue
      s[++c] = x * y
    } else if (mode == "p99") {
      y = v[a, "ideal-p99-ms", r] + 0
      if (y <= 0) continue
      s[++c] = x / y
    } else {
      if (!((b, mb, r) in v) || v[b, mb, r] + 0 == 0) continue
      s[++c] = x / v[b, mb, r]
    }
  }
  cnt = c
  if (c == 0) return 0
  for (i = 2; i <= c; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
  lo = s[1]; hi = s[c]
  med = (c % 2) ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2
  return 1
}
function cell(ok) { return ok ? sprintf("%.2f (%.2f-%.2f)", med, lo, hi) : "" }
function median1(k, metric,    r, c, s, i, j, t) {
  c = 0
  for (r = 1; r <= rounds; r++) if ((k, metric, r) in v) s[++c] = v[k, metric, r] + 0
  if (c == 0) return 0
  for (i = 2; i <= c; i++) for (j = i; j > 1 && s[j-1] > s[j]; j--) { t = s[j]; s[j] = s[j-1]; s[j-1] = t }
  return (c % 2) ? s[(c + 1) / 2] : (s[c / 2] + s[c / 2 + 1]) / 2
}
END {
  if (!rounds) rounds = 1
  if (n["u"]) {
    print "\nUncontended: one goroutine, acquire + release on a free key; " rounds " interleaved rounds."
    print "Ratios: median of the per-round ratios (min-max over the rounds). Client CPU: the benchmark"
    print "process's user + system time per cycle (median), which the server's own time is not part of.\n"
    print "| server | subject | cycles/s (median) | × raw round trip | × peer | client CPU µs/cycle |"
    print "|---|---|---:|---:|---:|---:|"
    for (i = 1; i <= n["u"]; i++) {
      k = order["u", i]; g = kgroup[k]
      raw = "u" SUBSEP g SUBSEP "raw-roundtrip"; p = peerOf("u", g)
      xr = (ksubj[k] == "raw-roundtrip") ? "" : cell(ratios(k, "cycles/s", raw, "cycles/s"))
      xp = (p == "" || k == p || ksubj[k] == "raw-roundtrip") ? "" : cell(ratios(k, "cycles/s", p, "cycles/s"))
      # shop's rows also beside every other peer of the group.
      if (ksubj[k] ~ /^shop-/) for (j = 1; j <= n["u"]; j++) {
        o = order["u", j]
        if (o != p && kgroup[o] == g && ksubj[o] != "raw-roundtrip" && ksubj[o] !~ /^shop-/)
          xp = xp "; × " ksubj[o] " " cell(ratios(k, "cycles/s", o, "cycles/s"))
      }
      printf "| %s | %s | %.0f | %s | %s | %.1f |\n", g, ksubj[k], median1(k, "cycles/s"), xr, xp, median1(k, "cpu-µs/cycle")
    }
  }
  if (n["c"]) {
    print "\nContended: 32 goroutines loop acquire / 1 ms critical section / release on one key; " rounds " interleaved rounds."
    print "× ideal: cycles/s × (critical section + 2 round trips), 1.0 = the ideal queue's throughput;"
    print "p99 ÷ ideal: p99 wait over the ideal queue's, (N−1) × (critical section + 2 round trips).\n"
    print "| server | subject | cycles/s (median) | × ideal | × peer | p99 wait ms (median) | p99 ÷ ideal | max wait ms | gave up | fairness |"
    print "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for (i = 1; i <= n["c"]; i++) {
      k = order["c", i]; g = kgroup[k]; p = peerOf("c", g)
      xi = cell(ratios(k, "cycles/s", "", "", "ideal"))
      xp = (p == "" || k == p) ? "" : cell(ratios(k, "cycles/s", p, "cycles/s"))
      xq = cell(ratios(k, "p99-ms", "", "", "p99"))
      printf "| %s | %s | %.0f | %s | %s | %.1f | %s | %.1f | %.0f | %.3f |\n", g, ksubj[k], median1(k, "cycles/s"), xi, xp,
        median1(k, "p99-ms"), xq, median1(k, "max-ms"), median1(k, "gaveup"), median1(k, "fairness")
    }
  }
}
