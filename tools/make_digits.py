#!/usr/bin/env python3
"""Write data/digits.csv from scikit-learn's copy of the 8x8 digits data.

scikit-learn ships sklearn/datasets/data/digits.csv.gz: 1797 rows, each the
64 pixel counts (integers 0..16) followed by the label (0..9). libdp's CSV
format puts the label first, so this script moves the last column to the
front and keeps the row order. Python 3 standard library only.

Usage: python3 tools/make_digits.py [SOURCE.csv.gz] [-o data/digits.csv]
"""
import argparse
import csv
import gzip
import os
import sys

DEBIAN_PATH = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
N_FEATURES = 64
N_ROWS = 1797


def find_source():
    """The Debian path if present, else the copy inside an importable sklearn."""
    if os.path.exists(DEBIAN_PATH):
        return DEBIAN_PATH
    try:
        import sklearn.datasets  # only used to locate the file
    except Exception:
        return None
    path = os.path.join(os.path.dirname(sklearn.datasets.__file__), "data",
                        "digits.csv.gz")
    return path if os.path.exists(path) else None


def convert(src, dst):
    rows = []
    with gzip.open(src, "rt", newline="") as f:
        for lineno, rec in enumerate(csv.reader(f), 1):
            if not rec:
                continue
            if len(rec) != N_FEATURES + 1:
                raise ValueError("%s:%d: %d fields, expected %d"
                                 % (src, lineno, len(rec), N_FEATURES + 1))
            # integers; some copies write them as "0.0", so go through float
            nums = [float(v) for v in rec]
            if any(v != int(v) for v in nums):
                raise ValueError("%s:%d: non-integer value" % (src, lineno))
            vals = [int(v) for v in nums]
            feats, label = vals[:N_FEATURES], vals[N_FEATURES]
            if not 0 <= label <= 9 or any(not 0 <= v <= 16 for v in feats):
                raise ValueError("%s:%d: value out of range" % (src, lineno))
            rows.append([label] + feats)
    if len(rows) != N_ROWS:
        raise ValueError("%s: %d rows, expected %d" % (src, len(rows), N_ROWS))
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    tmp = dst + ".tmp"
    with open(tmp, "w", newline="") as f:
        for r in rows:
            f.write(",".join(str(v) for v in r))
            f.write("\n")
    os.replace(tmp, dst)
    return len(rows)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", nargs="?", help="digits.csv.gz (default: %s)"
                    % DEBIAN_PATH)
    ap.add_argument("-o", "--output",
                    default=os.path.join(here, "..", "data", "digits.csv"))
    args = ap.parse_args()
    src = args.source or find_source()
    if not src:
        sys.exit("make_digits: digits.csv.gz not found; install python3-sklearn "
                 "or pass its path")
    try:
        n = convert(src, args.output)
    except (OSError, ValueError) as e:
        sys.exit("make_digits: %s" % e)
    print("wrote %s (%d rows)" % (os.path.relpath(args.output), n))


if __name__ == "__main__":
    main()
