#!/usr/bin/env python3
"""Checks the source tree's shape rules, which no compiler checks.

1. Layers: inside every module, its child modules use each other without a
   cycle. A child's files may use the parent's own items (`super::X`) and the
   parent may use its children; but if `a` uses `b` and `b` uses `a` (directly
   or through other siblings), neither is a layer below the other, and the
   two must be merged or the shared part moved out. An edge is any path
   written in a file (`crate::..`, `super::..`, `self::..`, or a child's
   name in a `mod.rs`), resolved to the deepest module file it names.
2. Size: no non-test source file is over 1 000 lines, and no non-test
   function over 120 lines.
3. Self-contained: no file in the repository points at notes outside it.
4. Explicit imports: no non-test file imports its parent wholesale
   (`use super::*`); a file names what it takes, so its imports say what
   it touches.
5. One module layout: a module with children is `foo.rs` beside `foo/`,
   never `foo/mod.rs` (under `src/`; a crate's `tests/common/mod.rs` is
   Cargo's way to share helpers between test targets and stays).
6. Unit tests are children of what they test: a file `tests.rs` or
   `*_tests.rs` under `src/` is declared by its parent module's file, under
   `#[cfg(test)]`.

Test code is not held to these rules: files named `tests.rs` or
`*_tests.rs`, files under a `tests/` or `benches/` directory, and items
marked `#[cfg(test)]`.

Usage: integration/check_architecture.py [REPO]   (exits 1 naming each breach)
"""

import os
import re
import subprocess
import sys

MAX_LINES = 1000
MAX_FUNCTION_LINES = 120
IDENT = r'[A-Za-z_][A-Za-z0-9_]*'
# Words that point at the design notes kept outside the repository.
OUTSIDE_POINTERS = ('../shared/', 'fn-api-notes', 'shared/design.md')


def crate_roots(repo):
  """(name, src dir) of every crate: each Cargo.toml with a src/lib.rs or
  src/main.rs."""
  out = subprocess.run(
    ['git', 'ls-files', '*Cargo.toml'], cwd=repo, capture_output=True, text=True, check=True
  ).stdout
  roots = []
  for manifest in out.split():
    src = os.path.join(repo, os.path.dirname(manifest), 'src')
    if os.path.isdir(src):
      roots.append((os.path.dirname(manifest) or '.', src))
  return roots


def is_test_file(rel):
  parts = rel.split('/')
  name = parts[-1]
  return (
    name == 'tests.rs'
    or name.endswith('_tests.rs')
    or 'tests' in parts[:-1]
    or 'benches' in parts[:-1]
  )


def module_path(rel):
  """The module path of a file relative to src/: lib.rs -> (),
  a/mod.rs -> ('a',), a/b.rs -> ('a', 'b')."""
  parts = rel[:-3].split('/')
  if parts[-1] in ('mod', 'lib', 'main'):
    parts = parts[:-1]
  return tuple(parts)


def strip_comments_and_strings(text):
  text = re.sub(r'//[^\n]*', '', text)
  text = re.sub(r'/\*.*?\*/', '', text, flags=re.S)
  # A raw string's `r` starts a token: the `r"` that ends `"docker"` is no
  # raw string.
  text = re.sub(r'(?<![A-Za-z0-9_])b?r#*"(?:.|\n)*?"#*', '""', text)
  text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
  return text


def non_test_part(code):
  """`code` without its `#[cfg(test)]` items: a braced item (a `mod`, an
  `impl`, a function) is cut to its closing brace, anything else to its
  semicolon. Comments and strings must be stripped first."""
  out, pos = [], 0
  marker = re.compile(r'#\[cfg\(test\)\]')
  while True:
    m = marker.search(code, pos)
    if not m:
      out.append(code[pos:])
      return ''.join(out)
    out.append(code[pos : m.start()])
    i = m.end()
    while i < len(code) and code[i] not in '{;':
      i += 1
    if i < len(code) and code[i] == '{':
      depth = 0
      while i < len(code):
        depth += {'{': 1, '}': -1}.get(code[i], 0)
        i += 1
        if depth == 0:
          break
    else:
      i += 1
    pos = i


def expand_use(tree):
  """Every full path of a `use` tree such as `a::{b, c::{d, e}}`."""
  # Renames (`x as y`) first: the path is what is left of `as`.
  tree = re.sub(r'\s+as\s+\w+', '', tree)
  tree = re.sub(r'\s+', '', tree)
  brace = tree.find('{')
  if brace < 0:
    return [tree]
  prefix, inner = tree[:brace], tree[brace + 1 : tree.rfind('}')]
  depth, start, parts = 0, 0, []
  for i, ch in enumerate(inner):
    if ch == '{':
      depth += 1
    elif ch == '}':
      depth -= 1
    elif ch == ',' and depth == 0:
      parts.append(inner[start:i])
      start = i + 1
  parts.append(inner[start:])
  paths = []
  for part in parts:
    if part:
      paths.extend(prefix + p for p in expand_use(part))
  return paths


def referenced_paths(code, children):
  """Paths (lists of segments, first one crate/super/self or a child
  module's name) that `code` names."""
  paths = []
  for m in re.finditer(r'\buse\s+([^;]+);', code):
    paths.extend(p.split('::') for p in expand_use(m.group(1)))
  code = re.sub(r'\buse\s+[^;]+;', '', code)
  pattern = r'\b((?:crate|super|self)(?:::' + IDENT + r')+)'
  paths.extend(m.group(1).split('::') for m in re.finditer(pattern, code))
  for child in children:
    for m in re.finditer(r'(?<![:\w])(' + child + r'(?:::' + IDENT + r')+)', code):
      paths.append(m.group(1).split('::'))
  return paths


def resolve(segments, here, modules):
  """The deepest module in `modules` that the path names, or None."""
  if not segments:
    return None
  head, rest = segments[0], segments[1:]
  if head == 'crate':
    base = ()
  elif head == 'self':
    base = here
  elif head == 'super':
    base = here[:-1]
    while rest and rest[0] == 'super':
      base, rest = base[:-1], rest[1:]
  else:
    base, rest = here, segments
  path = base
  best = base if base in modules else None
  for seg in rest:
    path = path + (seg,)
    if path in modules:
      best = path
    else:
      break
  return best


def tangles(nodes, edges):
  """The strongly connected components of more than one node: sets of
  modules each of which uses every other, directly or not (Tarjan)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []

  def visit(n):
    index[n] = low[n] = len(index)
    stack.append(n)
    on_stack.add(n)
    for m in sorted(edges.get(n, ())):
      if m not in index:
        visit(m)
        low[n] = min(low[n], low[m])
      elif m in on_stack:
        low[n] = min(low[n], index[m])
    if low[n] == index[n]:
      component = []
      while True:
        m = stack.pop()
        on_stack.discard(m)
        component.append(m)
        if m == n:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for n in sorted(nodes):
    if n not in index:
      visit(n)
  return found


def function_lengths(code):
  """(name, lines) of every function with a body in `code` (comments and
  strings stripped): from `fn` to its closing brace."""
  for m in re.finditer(r'\bfn\s+(' + IDENT + r')[^;{]*\{', code):
    i, depth = m.end() - 1, 0
    while i < len(code):
      depth += {'{': 1, '}': -1}.get(code[i], 0)
      if depth == 0:
        break
      i += 1
    yield m.group(1), code.count('\n', m.start(), i) + 1


def check_code(crate, rel, code):
  """The rules one file's non-test code is held to on its own."""
  problems = []
  where = f'{crate}/src/{rel}'
  for name, lines in function_lengths(code):
    if lines > MAX_FUNCTION_LINES:
      problems.append(f'{where}: fn {name} has {lines} lines (at most {MAX_FUNCTION_LINES})')
  if re.search(r'\buse\s+super::\*\s*;', code):
    problems.append(f'{where}: `use super::*` (name what the file imports)')
  return problems


def check_crate(crate, src):
  problems = []
  files = {}
  for dirpath, _, names in os.walk(src):
    for name in names:
      if name.endswith('.rs'):
        full = os.path.join(dirpath, name)
        files[os.path.relpath(full, src)] = full
  modules = {}
  for rel in files:
    if not is_test_file(rel):
      modules[module_path(rel)] = rel
  problems.extend(check_layout(crate, files))
  # (parent module) -> {child name -> set of sibling names it uses}
  sibling_edges = {}
  for mod, rel in modules.items():
    with open(files[rel], encoding='utf-8') as f:
      text = f.read()
    lines = text.count('\n')
    if lines > MAX_LINES:
      problems.append(f'{crate}/src/{rel}: {lines} lines (at most {MAX_LINES})')
    code = non_test_part(strip_comments_and_strings(text))
    problems.extend(check_code(crate, rel, code))
    children = sorted({m[len(mod)] for m in modules if len(m) > len(mod) and m[: len(mod)] == mod})
    for segments in referenced_paths(code, children):
      target = resolve(segments, mod, modules)
      if target is None or target == mod:
        continue
      common = 0
      while common < len(mod) and common < len(target) and mod[common] == target[common]:
        common += 1
      if common == len(mod) or common == len(target):
        continue  # an ancestor or a descendant: not a sibling
      parent = mod[:common]
      sibling_edges.setdefault(parent, {}).setdefault(mod[common], set()).add(target[common])
  for parent, edges in sorted(sibling_edges.items()):
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for tangle in tangles(nodes, edges):
      where = '/'.join(parent) or 'the crate root'
      uses = '; '.join(
        f'{a} uses {", ".join(sorted(set(edges.get(a, ())) & set(tangle)))}' for a in tangle
      )
      problems.append(f'{crate}: modules in {where} use each other in a cycle ({uses})')
  return problems


def parent_file(rel):
  """The file that declares the module in `rel` (relative to src/):
  a/b.rs -> a.rs, b.rs -> lib.rs or main.rs (whichever the crate has)."""
  parts = rel.split('/')
  if len(parts) == 1:
    return None
  return '/'.join(parts[:-1]) + '.rs'


def check_layout(crate, files):
  """Rules 5 and 6 over one crate's files (relative to src/ -> full path)."""
  problems = []
  for rel in sorted(files):
    where = f'{crate}/src/{rel}'
    name = rel.split('/')[-1]
    if name == 'mod.rs':
      problems.append(f'{where}: `mod.rs` (the module is `{rel[:-7]}.rs` beside its folder)')
      continue
    if name != 'tests.rs' and not name.endswith('_tests.rs'):
      continue
    parent = parent_file(rel)
    if parent is None:
      roots = [r for r in ('lib.rs', 'main.rs') if r in files]
      parent = roots[0] if roots else None
    if parent is None or parent not in files:
      problems.append(f'{where}: a test file whose parent module has no file')
      continue
    with open(files[parent], encoding='utf-8') as f:
      text = strip_comments_and_strings(f.read())
    declared = re.search(
      r'#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+' + re.escape(name[:-3]) + r'\s*;', text
    )
    if not declared:
      problems.append(f'{where}: not declared `#[cfg(test)] mod {name[:-3]};` by {parent}')
  return problems


def check_outside_pointers(repo):
  out = subprocess.run(
    ['git', 'grep', '-n', '-I', '-F']
    + sum((['-e', p] for p in OUTSIDE_POINTERS), [])
    + ['--', '.', ':!integration/check_architecture.py'],
    cwd=repo,
    capture_output=True,
    text=True,
  ).stdout
  return [f'points outside the repository: {line}' for line in out.splitlines()]


def main():
  repo = (
    sys.argv[1]
    if len(sys.argv) > 1
    else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  problems = []
  for crate, src in crate_roots(repo):
    problems.extend(check_crate(crate, src))
  problems.extend(check_outside_pointers(repo))
  for p in problems:
    print(p)
  if problems:
    print(f'check_architecture: {len(problems)} problem(s)')
    return 1
  print(
    'check_architecture: layers acyclic, files within '
    f'{MAX_LINES} lines, functions within {MAX_FUNCTION_LINES}, imports '
    'named, one module layout, unit tests beside what they test, nothing '
    'points outside the repository'
  )
  return 0


if __name__ == '__main__':
  sys.exit(main())
