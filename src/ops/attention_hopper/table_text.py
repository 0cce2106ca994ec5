"""Reading a generated selection_table.hpp (make_table.py's output): its point rows and its
provenance. make_table.py reads its --base header through these, and the table tools' tests
(make_table_test.py, scripts/attention_table_test.py) read the headers they produce."""
import re


def point_rows(text):
    """The header's point rows in order, each without its indentation: "{DType::bf16, ...},"."""
    return [line.strip() for line in text.splitlines() if line.strip().startswith("{DType::")]


def provenance(text):
    """kSelectionProvenance: the string literal's pieces joined."""
    return "".join(re.findall(r'"([^"]*)"', re.search(
        r'kSelectionProvenance =\s*((?:"[^"]*"\s*)+);', text).group(1)))
