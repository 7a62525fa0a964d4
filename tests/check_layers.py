#!/usr/bin/env python3
"""The include rules of docs/ARCHITECTURE.md: which folder may include which
headers. Every "..." include of lib/, cuda/ and tools/ is resolved to the file
it names and checked against its folder's row; a violation is printed as
file:line with the rule it breaks, and the check fails.

Usage: tests/check_layers.py [ROOT]
"""
import os
import re
import sys

# folder -> what its files may include ("..." form): folders (every header in
# it) or single headers. include/ is the public API, open to all.
SEAM = ['lib/core/backend.h', 'lib/core/plan.h', 'lib/core/operands.h']
RULES = {
    'lib/util': ['lib/util'],
    'lib/model': ['lib/util', 'lib/model'],
    'lib/core': ['lib/util', 'lib/model', 'lib/core'],
    # a backend sees the core only through the seam headers
    'lib/cpu': ['lib/util', 'lib/model', 'lib/cpu'] + SEAM,
    'cuda': ['lib/util', 'lib/model', 'cuda'] + SEAM,
    'lib/format': ['lib/util', 'lib/model', 'lib/core'],
    'lib/mpi': ['lib/util', 'lib/core', 'lib/mpi'],
    # lib/builtin.c: the one file that names the built-in backends
    'lib': ['lib/cpu/cpu.h'],
    'tools': ['tools'],
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def resolve(root, src, name):
    """The file an include names: beside the source, else on the search path
    (-Iinclude -Ilib -Itools -iquote cuda)."""
    for base in (os.path.dirname(src), 'include', 'lib', 'tools', 'cuda'):
        path = os.path.normpath(os.path.join(base, name))
        if os.path.isfile(os.path.join(root, path)):
            return path
    return None


def allowed(folder, target):
    if target.startswith('include/'):
        return True
    for r in RULES[folder]:
        if target == r or target.startswith(r + '/') and os.path.dirname(target) == r:
            return True
    return False


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), '..'))
    bad = []
    n = 0
    for folder in RULES:
        top = os.path.join(root, folder)
        for name in sorted(os.listdir(top)):
            src = os.path.join(folder, name)
            if not os.path.isfile(os.path.join(root, src)) or \
                    not re.search(r'\.(c|h|cu|cuh)$', name):
                continue
            with open(os.path.join(root, src), errors='replace') as f:
                for line_no, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    n += 1
                    target = resolve(root, src, m.group(1))
                    if target is None:
                        bad.append('%s:%d: "%s" is no file of the project' %
                                   (src, line_no, m.group(1)))
                    elif not allowed(folder, target):
                        bad.append('%s:%d: %s may not include %s (it may include: %s)' %
                                   (src, line_no, folder, target,
                                    ', '.join(['include/'] + RULES[folder])))
    for b in bad:
        print(b)
    print('check_layers: %d includes in %d folders, %d break the rules' %
          (n, len(RULES), len(bad)))
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
