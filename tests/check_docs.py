#!/usr/bin/env python3
"""README.md and docs/*.md name only what the code has (issue 27): every
dp_*/dp__*/dpt_* identifier they mention must occur in the sources (lib/,
cuda/, include/, tools/, tests/, examples/, bench/, fuzz/), and every flag of a
`dp` command line they show (`dp CMD ... --flag`, `build/dp ...`) must be one of
the tool's (a string in tools/*.c). Prints each name the code lacks, with the
file and line that names it; exit 1 when there is any."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC_DIRS = ['lib', 'cuda', 'include', 'tools', 'tests', 'examples', 'bench', 'fuzz']
SRC_EXT = ('.c', '.h', '.cu', '.cuh', '.cc', '.py', '.sh', '.S')
IDENT = re.compile(r'\b(dpt?_{1,2}[A-Za-z0-9_]*[A-Za-z0-9])\b')
CMDLINE = re.compile(r'(?:^|[\s`$(])(?:build/|\./)?dp ([a-z]+)\b([^`\n]*)')
FLAG = re.compile(r'(?<![\w-])(--[a-z][a-z0-9-]*)')


def read(path):
    with open(path, encoding='utf-8', errors='replace') as f:
        return f.read()


def sources():
    text = []
    for d in SRC_DIRS:
        for dirpath, dirnames, files in os.walk(os.path.join(ROOT, d)):
            dirnames[:] = [x for x in dirnames if not x.startswith('.')]
            for name in files:
                if name.endswith(SRC_EXT) and name != 'check_docs.py':
                    text.append(read(os.path.join(dirpath, name)))
    text.append(read(os.path.join(ROOT, 'configure.py')))
    return '\n'.join(text)


def tool_flags():
    flags = set()
    tools = os.path.join(ROOT, 'tools')
    for name in os.listdir(tools):
        if name.endswith('.c'):
            for m in re.finditer(r'"([a-z][a-z0-9-]*)"', read(os.path.join(tools, name))):
                flags.add('--' + m.group(1))
            for m in FLAG.finditer(read(os.path.join(tools, name))):
                flags.add(m.group(1))
    return flags


def commands():
    """The dp tool's commands: the names in tools/dp.c's table."""
    return set(re.findall(r'\{"([a-z]+)", dpt_cmd_', read(os.path.join(ROOT, 'tools', 'dp.c'))))


def main():
    src = sources()
    cmds = commands()
    known = set(IDENT.findall(src))
    flags = tool_flags()
    docs = [os.path.join(ROOT, 'README.md')]
    ddir = os.path.join(ROOT, 'docs')
    docs += sorted(os.path.join(ddir, n) for n in os.listdir(ddir) if n.endswith('.md'))
    missing = []
    for path in docs:
        rel = os.path.relpath(path, ROOT)
        for lineno, line in enumerate(read(path).splitlines(), 1):
            for name in IDENT.findall(line):
                if name not in known:
                    missing.append('%s:%d: %s is named here, not in the code' %
                                   (rel, lineno, name))
            for m in CMDLINE.finditer(line):
                if m.group(1) not in cmds:
                    continue
                for flag in FLAG.findall(m.group(2)):
                    if flag not in flags:
                        missing.append('%s:%d: dp %s %s: the tool has no such flag' %
                                       (rel, lineno, m.group(1), flag))
    for m in missing:
        print(m)
    if missing:
        print('check_docs: %d name(s) in the docs that the code lacks: fix the docs '
              '(or the code)' % len(missing))
        return 1
    print('check_docs: every dp_/dp__/dpt_ name and dp flag the docs show exists')
    return 0


if __name__ == '__main__':
    sys.exit(main())
