#!/usr/bin/env python3
"""Lists C++/CUDA functions longer than N lines (default 120) and exits 1 if there are any.

    scripts/function_lengths.py [N] [--root DIR] [paths...]

Scans engine/, kernels/, models/ and apps/ (or the given files and directories) for .cpp .cu .h
.cuh files and prints `file:line name length` for each function whose body is longer than N lines,
longest first. The length counts the lines from the line of the function's name to its closing
brace, both included.

The parse is a heuristic, not a compiler: comments, string and character literals (raw strings
included) and preprocessor lines are blanked first, so braces inside them do not count; then braces
are matched with a stack. A `{` outside any function opens a function body when the text since the
previous `;`, `{` or `}` has a parenthesis and does not start with namespace, class, struct, union,
enum or extern (a constructor's member initializers, `a_{x}`, are skipped over; a lambda assigned at
namespace scope counts under its variable's name). Everything inside a body, lambdas and local
classes included, belongs to that function. Code under both arms of an #if that opens a brace in
each arm can confuse it.
"""
import argparse
import os
import re
import sys

EXTENSIONS = (".cpp", ".cu", ".h", ".cuh")
DEFAULT_DIRS = ("engine", "kernels", "models", "apps")
SCOPE_KEYWORDS = re.compile(r"^(?:template\s*<.*?>\s*)?(?:namespace|class|struct|union|enum|extern)\b", re.S)
NAME_BEFORE_PAREN = re.compile(
    r"((?:[A-Za-z_]\w*(?:\s*<[^<>()]*>)?\s*::\s*)*~?(?:operator\s*(?:\(\s*\)|[^\s\w(]+|\s+[\w:<> ]+?)|[A-Za-z_]\w*))\s*$")


def blank_non_code(text):
    """The text with comments, literals and preprocessor lines replaced by spaces; newlines kept."""
    out = list(text)
    n = len(text)
    i = 0
    line_start = True  # only whitespace since the last newline (a '#' there starts a directive)

    def blank(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c == "#":  # a directive, with its backslash continuations
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):  # a block comment inside the directive ends wherever it ends
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                j += 1
            blank(i, j)
            i = j
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            blank(i, j)
            i = j
            continue
        if c == '"':
            m = None
            # A raw string: R"delim( ... )delim", with an optional encoding prefix before the R.
            k = i - 1
            if k >= 0 and text[k] == "R" and (k == 0 or not (text[k - 1].isalnum() or text[k - 1] == "_")
                                              or text[max(0, k - 2):k] == "u8" or text[k - 1] in "uUL"):
                m = re.compile(r'"([^ ()\\\t\n]{0,16})\(').match(text, i)
            if m:
                close = ")" + m.group(1) + '"'
                j = text.find(close, m.end())
                j = n if j < 0 else j + len(close)
                blank(i, j)
                i = j
                continue
            j = i + 1
            while j < n and text[j] != '"' and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i, min(j + 1, n))
            i = j + 1
            continue
        if c == "'":
            # A digit separator (1'000'000, 0xFF'FF) is inside a number token; otherwise a char literal.
            k = i - 1
            while k >= 0 and (text[k].isalnum() or text[k] in "_.'"):
                k -= 1
            token = text[k + 1:i]
            if token and token[0].isdigit():
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            blank(i, min(j + 1, n))
            i = j + 1
            continue
        i += 1
    return "".join(out)


def top_level(header):
    """The header with every bracketed part (parentheses, angle-free) blanked but its brackets kept."""
    out, depth = [], 0
    for ch in header:
        if ch == "(":
            out.append("(" if depth == 0 else " ")
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
            out.append(")" if depth == 0 else " ")
        else:
            out.append(ch if depth == 0 else " ")
    return "".join(out)


def strip_template(h):
    """h without a leading `template <...>` (its angle brackets balanced)."""
    m = re.match(r"template\s*<", h)
    if not m:
        return h
    depth, k = 1, m.end()
    while k < len(h) and depth:
        depth += {"<": 1, ">": -1}.get(h[k], 0)
        k += 1
    return strip_template(h[k:].lstrip())


def has_initializer_list(header):
    """Whether the header is a constructor's `(...) : member(...)` so far (a ':' after the
    parameter list that is not part of '::')."""
    flat = top_level(header)
    close = flat.find(")")
    if close < 0:
        return False
    rest = flat[close + 1:]
    return re.search(r"(?<!:):(?!:)", rest) is not None


def function_name(header):
    """The function's name for a header (the text before its body's '{'), or None if not a function."""
    h = strip_template(" ".join(header.split()))
    if not h or SCOPE_KEYWORDS.match(h):
        return None
    flat = top_level(h)
    eq = re.search(r"(?<![=!<>+\-*/%&|^])=(?!=)", flat)
    if eq and not re.search(r"operator\s*\S*$", flat[:eq.start()]):
        # An assignment at this scope: a lambda (name it after the variable) or an initializer.
        if re.search(r"\]\s*\(", h[eq.end():]) or re.search(r"\]\s*(?:mutable\s*)?\{?\s*$", h[eq.end():]):
            m = re.search(r"([A-Za-z_]\w*)\s*$", h[:eq.start()])
            return (m.group(1) + " (lambda)") if m else "(lambda)"
        return None
    paren = flat.find("(")
    if paren < 0:
        return None
    if re.search(r"operator\s*$", h[:paren]) and re.match(r"\(\s*\)\s*\(", h[paren:]):
        # operator()(...): the first pair of parentheses is part of the name
        return "operator()"
    m = NAME_BEFORE_PAREN.search(h[:paren])
    if not m:
        return None
    name = re.sub(r"\s+", "", m.group(1)) if "operator" not in m.group(1) else " ".join(m.group(1).split())
    if name in ("if", "for", "while", "switch", "catch", "return", "sizeof", "decltype", "alignas", "static_assert"):
        return None
    return name


def functions(text):
    """(line, name, length) of every function defined in `text`."""
    code = blank_non_code(text)
    line_of = []  # line number of each character
    line = 1
    for ch in code:
        line_of.append(line)
        if ch == "\n":
            line += 1
    found = []
    stack = []  # per open brace: "scope" (namespace, class, ...), "other", "init" or ("fn", name, line)
    header_start = 0
    in_function = 0  # depth of braces inside the current function body, 0 outside
    for i, ch in enumerate(code):
        if in_function:
            if ch == "{":
                in_function += 1
            elif ch == "}":
                in_function -= 1
                if in_function == 0:
                    _, name, start = stack.pop()
                    found.append((start, name, line_of[i] - start + 1))
                    header_start = i + 1
            continue
        if ch == ";":
            header_start = i + 1
        elif ch == "{":
            header = code[header_start:i]
            if has_initializer_list(header) and re.search(r"[\w>]\s*$", header):
                stack.append("init")  # a member initializer a_{x}: part of the header
                continue
            name = function_name(header)
            if name:
                # The line of the name: the last occurrence of its final identifier before the '('.
                key = re.escape(name.split("::")[-1].split(" (")[0].split()[-1]) if name != "operator()" else r"operator"
                positions = [m.start() for m in re.finditer(key, header)]
                flat = top_level(header)
                paren = flat.find("(")
                before = [p for p in positions if paren < 0 or p < paren] or positions or [len(header.rstrip()) - 1]
                start = line_of[header_start + max(0, before[-1])] if header.strip() else line_of[i]
                stack.append(("fn", name, start))
                in_function = 1
            else:
                stack.append("scope" if SCOPE_KEYWORDS.match(" ".join(header.split())) else "other")
                header_start = i + 1
        elif ch == "}":
            kind = stack.pop() if stack else "scope"
            if kind != "init":
                header_start = i + 1
    return found


def source_files(paths):
    for path in paths:
        if os.path.isfile(path):
            if path.endswith(EXTENSIONS):
                yield path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("build"))
            for f in sorted(filenames):
                if f.endswith(EXTENSIONS):
                    yield os.path.join(dirpath, f)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("max_lines", nargs="?", type=int, default=120, help="the longest allowed (default 120)")
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."),
                        help="the repository root (default: this script's parent directory)")
    parser.add_argument("--paths", nargs="*", help="files or directories relative to the root (default: %s)"
                        % " ".join(DEFAULT_DIRS))
    args = parser.parse_args(argv)
    root = os.path.normpath(args.root)
    paths = [os.path.join(root, p) for p in (args.paths or DEFAULT_DIRS)]
    long_ones = []
    for path in source_files(p for p in paths if os.path.exists(p)):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for line, name, length in functions(text):
            if length > args.max_lines:
                long_ones.append((length, os.path.relpath(path, root), line, name))
    long_ones.sort(key=lambda r: (-r[0], r[1], r[2]))
    for length, path, line, name in long_ones:
        print(f"{path}:{line} {name} {length}")
    if long_ones:
        print(f"{len(long_ones)} function(s) longer than {args.max_lines} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
