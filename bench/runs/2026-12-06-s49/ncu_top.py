"""The instructions with the most warp stall samples, from ncu's per-launch SASS source pages (CSV, as
`ncu -i REPORT --page source --csv --print-source sass` writes them). Used by runs/2026-12-06-s47/
paged_source.sh and runs/2026-12-06-s49/ragged_source.sh.
    python ncu_top.py DIR PREFIX NAME...   (DIR/PREFIX_k.csv is the k-th launch, NAME its label)"""
import csv
import sys

TOP = 25


def main(directory, prefix, names):
    for k, name in enumerate(names):
        rows = list(csv.reader(open(f"{directory}/{prefix}_{k}.csv")))
        head = next((i for i, r in enumerate(rows) if "Source" in r), None)
        if head is None or not any(c.startswith("Warp Stall Sampling (All") for c in rows[head]):
            print(f"== {name}: no source table; the CSV begins:", *rows[:6], sep="\n")
            continue
        cols = rows[head]
        src = cols.index("Source")
        samp = next(i for i, c in enumerate(cols) if c.startswith("Warp Stall Sampling (All"))
        body = [r for r in rows[head + 1:] if len(r) == len(cols)]
        total = sum(float(r[samp] or 0) for r in body)
        print(f"== {name}: {total:.0f} samples, {len(body)} instructions; the {TOP} with the most")
        for r in sorted(body, key=lambda r: -float(r[samp] or 0))[:TOP]:
            print(f"{float(r[samp] or 0):8.0f}  {r[0]:>6}  {r[src][:90]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
