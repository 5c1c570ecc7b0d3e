#!/usr/bin/env python3
"""Lengths of the functions in C++ files, longest first (lines from the signature to the closing brace).

  scripts/function_lengths.py apps/fashion_mnist/*.cpp          # every function, longest first
  scripts/function_lengths.py --max 120 apps/**/*.cpp           # exit 1 if any is longer than 120

A function is a brace block opened at namespace or class level after a ')' (the signature may span
lines, with const/noexcept/override or a constructor's initializer list after it). Comments, strings
and character literals are skipped; lambdas and control blocks count towards their function.
"""
import re
import signal
import sys


def strip(text):
    """The text with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) + len(m.group(1)) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2:end])); i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c); i = j + 1
        else:
            out.append(c); i += 1
    return "".join(out)


def functions(path):
    text = strip(open(path, encoding="utf-8").read())
    results, stack = [], []  # stack: (kind, start line, name)
    line, head_start, head = 1, 1, ""
    for c in text:
        if c == "{":
            h = head.strip()
            in_function = any(k == "function" for k, _, _ in stack)
            is_function = (not in_function and re.search(r"\)\s*(const|noexcept|override|final|\s)*$", h)
                           and not re.match(r"(if|for|while|switch|catch|else|do)\b", h)) or (
                not in_function and re.search(r"\)\s*:\s*[\w:]+[({]", h))  # constructor with initializers
            if is_function:
                name = re.search(r"([~\w:<>]+)\s*\((?!.*\b[~\w:<>]+\s*\()", h.split(":")[0] if ") :" in h else h)
                stack.append(("function", head_start, name.group(1) if name else h[:40]))
            else:
                stack.append(("block", line, ""))
            head, head_start = "", line
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    results.append((line - start + 1, path, start, name))
            head, head_start = "", line
        elif c == ";":
            if not any(k == "function" for k, _, _ in stack):
                head, head_start = "", line
        else:
            if not head.strip() and not c.isspace():
                head_start = line
            head += c
        if c == "\n":
            line += 1
    return results


def main(argv):
    limit = None
    if len(argv) > 1 and argv[0] == "--max":
        limit, argv = int(argv[1]), argv[2:]
    rows = sorted((r for p in argv for r in functions(p)), reverse=True)
    for length, path, start, name in rows:
        if limit is None or length > limit:
            print(f"{length:5d}  {path}:{start}  {name}")
    return 1 if limit is not None and any(r[0] > limit for r in rows) else 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends it quietly
    sys.exit(main(sys.argv[1:]))
