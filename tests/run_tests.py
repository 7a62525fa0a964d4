#!/usr/bin/env python3
"""Runs the steps of `ninja test` one after another and ends with one table.

Each step is a shell command (a Check test program or a check script). Its whole
output goes to LOGDIR/NN-name.log; the console gets one line per step, the lines
of a failed step that say why (Check's failures, FAILED lines, the log's tail),
then a table: step, checks, failures, skipped, seconds, and every distinct skip
reason once with its count. The last line is "test: N passed, N failed, N skipped"
(Check's checks, plus one per other step). Exit status 1 when any step failed.

usage: run_tests.py --logs DIR CMD [CMD ...]
"""
import os
import re
import subprocess
import sys
import time

CHECK_TOTAL = re.compile(r'^\d+%: Checks: (\d+), Failures: (\d+), Errors: (\d+)\s*$')
CHECK_FAIL = re.compile(r'^[^\s:]+:\d+:[FE]:')
# "SKIP suite: test name: reason", or "SKIP what: reason", or "SKIP what"
SKIP = re.compile(r'^SKIP ([^:]+)(?:: ([^:]+))?(?:: (.*))?$')
TAIL = 25


def name_of(cmd):
    """A short name: the program's file name, with its suite when one is chosen."""
    words = cmd.split()
    prog = next((w for w in words if '=' not in w.split('/')[0]), cmd)
    base = os.path.basename(prog)
    if base.startswith('python') and len(words) > words.index(prog) + 1:
        base = os.path.basename(words[words.index(prog) + 1])
    m = re.search(r'CK_RUN_SUITE=(\S+)', cmd)
    return base + (' ' + m.group(1) if m else '')


def run_step(i, cmd, logdir):
    name = name_of(cmd)
    safe = re.sub(r'[^A-Za-z0-9_.-]+', '_', name)
    log = os.path.join(logdir, '%02d-%s.log' % (i, safe))
    print('== %s' % cmd, flush=True)
    t0 = time.monotonic()
    with open(log, 'wb') as f:
        rc = subprocess.call(cmd, shell=True, stdout=f, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL)
    secs = time.monotonic() - t0
    with open(log, encoding='utf-8', errors='replace') as f:
        lines = f.read().splitlines()
    checks = fails = None
    skips, why = [], []
    for ln in lines:
        m = CHECK_TOTAL.match(ln)
        if m:
            checks = (checks or 0) + int(m.group(1))
            fails = (fails or 0) + int(m.group(2)) + int(m.group(3))
        elif CHECK_FAIL.match(ln) or ln.startswith('FAILED') or ' FAILED' in ln[:40]:
            why.append(ln)
        m = SKIP.match(ln)
        if m:
            skips.append((m.group(3) or m.group(2) or m.group(1)).strip())
    failed = rc != 0 or bool(fails)
    step = {'name': name, 'cmd': cmd, 'rc': rc, 'checks': checks, 'fails': fails,
            'skips': skips, 'secs': secs, 'log': log, 'failed': failed}
    state = 'FAILED (exit %d)' % rc if failed else 'ok'
    count = '' if checks is None else ', %d checks' % checks
    print('   %s%s, %d skipped, %.0f s (log: %s)' % (state, count, len(skips), secs, log),
          flush=True)
    if failed:
        for ln in why[:40]:
            print('   | ' + ln)
        print('   | ... the last %d lines of the log:' % TAIL)
        for ln in lines[-TAIL:]:
            print('   | ' + ln)
        sys.stdout.flush()
    return step


def table(steps):
    print()
    print('%-34s %8s %8s %8s %8s  %s' % ('step', 'checks', 'failed', 'skipped', 'seconds',
                                        'result'))
    passed = failed = skipped = 0
    for s in steps:
        checks = s['checks'] if s['checks'] is not None else 1
        fails = s['fails'] if s['fails'] is not None else (1 if s['failed'] else 0)
        if s['failed'] and fails == 0:
            fails = 1  # a crash or a non-zero exit after all checks passed
        nskip = min(len(s['skips']), max(checks - fails, 0))
        passed += max(checks - fails - nskip, 0)
        failed += fails
        skipped += nskip
        print('%-34s %8s %8d %8d %8.0f  %s' % (s['name'][:34], checks, fails, nskip,
                                             s['secs'], 'FAILED' if s['failed'] else 'ok'))
    reasons = {}
    for s in steps:
        for r in s['skips']:
            reasons[r] = reasons.get(r, 0) + 1
    if reasons:
        print('\nskipped, by reason:')
        for r, k in sorted(reasons.items(), key=lambda kv: -kv[1]):
            print('  %4d  %s' % (k, r))
    bad = [s for s in steps if s['failed']]
    if bad:
        print('\nfailed:')
        for s in bad:
            print('  %s (exit %d): %s' % (s['name'], s['rc'], s['log']))
    print('\ntest: %d passed, %d failed, %d skipped' % (passed, failed, skipped))
    return 1 if bad else 0


def main(argv):
    if len(argv) < 3 or argv[0] != '--logs':
        sys.stderr.write(__doc__)
        return 2
    logdir = argv[1]
    os.makedirs(logdir, exist_ok=True)
    steps = [run_step(i, cmd, logdir) for i, cmd in enumerate(argv[2:], 1)]
    return table(steps)


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
