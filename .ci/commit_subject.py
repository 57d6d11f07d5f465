"""commit-msg hook: a commit's subject (its first line) holds at most 72 characters; details go in the body.

Usage: ``python3 .ci/commit_subject.py MESSAGE_FILE`` (pre-commit passes the file git wrote).
Exit 1 with one line naming the length when the subject is longer, or when it is empty.
"""

import sys

LIMIT = 72


def check(message: str) -> str | None:
    """The complaint about ``message``'s subject, or ``None`` when it is fine (git's comment lines skipped)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    subject = lines[0].rstrip() if lines else ""
    if not subject:
        return "commit subject is empty: write one line of at most 72 characters, details in the body"
    if len(subject) > LIMIT:
        return f"commit subject has {len(subject)} characters (at most {LIMIT}): shorten it, details in the body"
    return None


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: commit_subject.py MESSAGE_FILE", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        complaint = check(f.read())
    if complaint:
        print(complaint, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
