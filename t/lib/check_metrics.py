#!/usr/bin/python3
"""Checks a Prometheus text page (stdin) with the prometheus_client parser and the rules of
the exposition format that parser lets pass: every sample in a family declared with HELP and
TYPE, counters named *_total, histogram buckets cumulative with +Inf equal to _count, no
duplicate series. Prints one summary line (families, samples, lines) or the problems; exit 1
on problems."""
import sys
from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
problems = []
try:
    families = list(text_string_to_metric_families(text))
except Exception as e:  # the parser's own error: malformed line, bad escape, ...
    print(f"parse error: {e}")
    sys.exit(1)

declared = {}
for line in text.splitlines():
    if line.startswith("# TYPE "):
        _, _, name, kind = line.split(" ", 3)
        declared[name] = kind
    elif line.startswith("# HELP ") or not line.strip():
        continue
    elif line.startswith("#"):
        problems.append(f"stray comment: {line}")

seen = set()
samples = 0
for f in families:
    if f.name not in declared and f.name + "_total" not in declared:
        problems.append(f"family {f.name} has no TYPE line")
    # A family with no sample is legal (a ranked counter with nothing to name yet).
    if f.type == "counter" and f.samples and not any(s.name.endswith("_total") for s in f.samples):
        problems.append(f"counter {f.name} has no _total sample")
    if not f.documentation:
        problems.append(f"family {f.name} has no HELP")
    buckets = {}
    counts = {}
    for s in f.samples:
        samples += 1
        key = (s.name, tuple(sorted(s.labels.items())))
        if key in seen:
            problems.append(f"duplicate series {key}")
        seen.add(key)
        if s.value != s.value:
            problems.append(f"NaN in {key}")
        if f.type == "histogram":
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            if s.name.endswith("_bucket"):
                buckets.setdefault(labels, []).append((float(s.labels["le"]), s.value))
            elif s.name.endswith("_count"):
                counts[labels] = s.value
    for labels, bs in buckets.items():
        values = [v for _, v in sorted(bs)]
        if values != sorted(values):
            problems.append(f"{f.name}{dict(labels)}: buckets not cumulative")
        if sorted(bs)[-1][0] != float("inf") or sorted(bs)[-1][1] != counts.get(labels):
            problems.append(f"{f.name}{dict(labels)}: +Inf bucket differs from _count")

if problems:
    print("\n".join(problems))
    sys.exit(1)
print(f"ok: {len(families)} families, {samples} samples, {len(text.splitlines())} lines")
