"""Tokenizes text for keel-data with a Hugging Face tokenizer.json (the `tokenizers` library).

keel-data runs this script and reads its standard output; users run keel-data, not this.

  keel_tokenize.py --tokenizer tokenizer.json [--eos TOKEN] [--format auto|text|jsonl]
                   [--field text] [--text-split file|paragraph|line] FILE...

Documents: a JSONL line is one document (the string at --field; blank lines are skipped); a
plain-text file is one document (--text-split file), or one per paragraph (runs of blank lines
separate them) or one per non-blank line. Documents are encoded without special tokens
(add_special_tokens=False): keel-data appends the EOS itself after each one. Their text is
encoded literally (encode_special_tokens=True): "<|endoftext|>" written in a document is text,
never the EOS or another special token, so every document ends at its one EOS.

Output (little-endian), a stream of records after one header:
  header   b"KEELTKZ1", u64 vocabulary size, u64 EOS id, u32 length + the EOS token (UTF-8)
  'B'      u32 documents n, u32 token count of each, then every document's ids as u32
  'P'      u64 input bytes consumed so far (all files)
  'Z'      u64 documents in all: the input was read to its end
Bad input: one line on stderr naming the file (and line), exit status 2, no 'Z'. Whatever goes wrong
reading or parsing one line (a JSON value nested too deeply for the parser, say) is bad input at
that line; any other failure is the tool's own: a traceback and exit status 1.
"""
import argparse
import json
import os
import struct
import sys
from array import array

# The end-of-document tokens of common tokenizer families, tried in this order when neither
# --eos nor tokenizer_config.json names one: Llama 2 / Mistral / T5, Llama 3, GPT-2 / Qwen,
# DeepSeek-V3, Gemma.
COMMON_EOS = ["</s>", "<|end_of_text|>", "<|endoftext|>", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<eos>"]
# A batch is encoded at once (the library spreads a batch over threads) once it holds this many
# documents or bytes of text; a long plain-text document is a batch by itself.
BATCH_DOCUMENTS = 1024
BATCH_BYTES = 4 << 20
JSONL_SUFFIXES = (".jsonl", ".ndjson")
# A plain-text file read as one document is encoded in one call: a 24 MB document took 3.5 GB
# with a byte-level BPE, so a file this large gets a warning.
LARGE_DOCUMENT = 64 << 20
MEMORY_PER_BYTE = 150


class BadInput(Exception):
    pass


def json_kind(value):
    """How a JSON value reads in a message: "an object", "a number", "null"."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), "a number")


def line_of(data, offset):
    return data.count(b"\n", 0, offset) + 1


def eos_from_config(tokenizer_path):
    """The eos_token of tokenizer_config.json next to tokenizer.json, if that file names one."""
    path = os.path.join(os.path.dirname(os.path.abspath(tokenizer_path)), "tokenizer_config.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: {e}")
    eos = config.get("eos_token") if isinstance(config, dict) else None
    if isinstance(eos, dict):
        eos = eos.get("content")
    return eos if isinstance(eos, str) else None


def resolve_eos(tokenizer, tokenizer_path, requested):
    if requested is not None:
        eos_id = tokenizer.token_to_id(requested)
        if eos_id is None:
            raise BadInput(f"--eos: {requested!r} is not a token of {tokenizer_path}")
        return requested, eos_id
    named = eos_from_config(tokenizer_path)
    if named is not None:
        eos_id = tokenizer.token_to_id(named)
        if eos_id is None:
            raise BadInput(f"tokenizer_config.json next to {tokenizer_path} names eos_token {named!r}, "
                           "which is not a token of the tokenizer")
        return named, eos_id
    for token in COMMON_EOS:
        eos_id = tokenizer.token_to_id(token)
        if eos_id is not None:
            return token, eos_id
    raise BadInput(f"{tokenizer_path}: no EOS token found (no tokenizer_config.json eos_token, none of "
                   f"{', '.join(COMMON_EOS)}); name one with --eos TOKEN")


def numbered_lines(path):
    """Yields ("FILE:LINE", the line's bytes) for each line of a file; a failed read is bad input there."""
    with open(path, "rb") as f:
        number = 0
        while True:
            number += 1
            try:
                raw = f.readline()
            except OSError as e:
                raise BadInput(f"{path}:{number}: cannot read: {e.strerror or e}")
            if not raw:
                return
            yield f"{path}:{number}", raw


def jsonl_documents(path, field):
    """Yields (text or None, bytes consumed in this file) for each line of a JSONL file."""
    for where, raw in numbered_lines(path):
        yield (jsonl_text(raw, where, field) if raw.strip() else None), len(raw)


def jsonl_text(raw, where, field):
    """The document of one JSONL line; whatever goes wrong reading the line is bad input there."""
    try:
        return parse_jsonl_line(raw, where, field)
    except BadInput:
        raise
    except RecursionError:  # the json module recurses once per nesting level
        raise BadInput(f"{where}: not a JSON value: nested too deeply")
    except Exception as e:  # e.g. MemoryError: the line, not the tool, is at fault
        raise BadInput(f"{where}: cannot read the line: {type(e).__name__}: {e}")


def parse_jsonl_line(raw, where, field):
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not UTF-8 ({e.reason} at byte {e.start} of the line)")
    except ValueError as e:
        raise BadInput(f"{where}: not a JSON value: {e}")
    if not isinstance(record, dict):
        raise BadInput(f"{where}: {json_kind(record)}, not a JSON object with a {field!r} string")
    if field not in record:
        raise BadInput(f"{where}: no field {field!r}")
    text = record[field]
    if not isinstance(text, str):
        raise BadInput(f"{where}: field {field!r} is {json_kind(text)}, not a string")
    try:  # a JSON escape can make a lone surrogate, which no tokenizer encodes
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadInput(f"{where}: field {field!r} holds {e.object[e.start]!r}, not Unicode text ({e.reason})")
    return text


def text_documents(path, split):
    """Yields (text or None, bytes consumed in this file) for a plain-text file's documents."""
    if split == "file":
        yield whole_file(path), os.path.getsize(path)
        return
    # Line by line, so a large file streams: a document is a non-blank line, or a paragraph
    # (lines that are not blank, up to a blank line or the end), without its final line break.
    paragraph = []
    for where, raw in numbered_lines(path):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(f"{where}: not UTF-8 ({e.reason} at byte {e.start} of the line)")
        blank = not line.strip()
        if split == "line":
            yield (None if blank else line.rstrip("\r\n")), len(raw)
        elif not blank:
            paragraph.append(line)
            yield None, len(raw)
        else:
            yield ("".join(paragraph).rstrip("\r\n") if paragraph else None), len(raw)
            paragraph = []
    if paragraph:
        yield "".join(paragraph).rstrip("\r\n"), 0


def whole_file(path):
    """A plain-text file as one document: its exact text."""
    size = os.path.getsize(path)
    if size > LARGE_DOCUMENT:
        print(f"keel-data: warning: {path} is one document of {size / 1e6:.0f} MB; the library encodes a document "
              f"whole, at about {MEMORY_PER_BYTE} bytes of memory per byte of text (--text-split paragraph, or "
              "JSONL, makes smaller documents)", file=sys.stderr)
    with open(path, "rb") as f:
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}:{line_of(data, e.start)}: not UTF-8 ({e.reason} at byte {e.start})")


def main():
    parser = argparse.ArgumentParser(description="keel-data's tokenizer step (see the module docstring)")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--eos")
    parser.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto")
    parser.add_argument("--field", default="text")
    parser.add_argument("--text-split", choices=["file", "paragraph", "line"], default="file")
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError as e:
        raise BadInput(f"the Python package 'tokenizers' is needed for --tokenizer ({e}); "
                       "install it, or point KEEL_PYTHON at an interpreter that has it")
    try:
        tokenizer = tokenizers.Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # the library raises its own Exception for a malformed file
        raise BadInput(f"{args.tokenizer}: not a tokenizer.json the tokenizers library reads: {e}")
    # add_special_tokens=False does not stop special-token text in a document from matching the
    # special token itself: an EOS inside a document would cut it in two.
    if not hasattr(tokenizer, "encode_special_tokens"):
        raise BadInput(f"the Python package 'tokenizers' {tokenizers.__version__} cannot encode special-token text "
                       "literally; --tokenizer needs tokenizers 0.19 or later")
    tokenizer.encode_special_tokens = True
    eos_token, eos_id = resolve_eos(tokenizer, args.tokenizer, args.eos)
    # Added tokens may sit above the base vocabulary; every id must be below the recorded size.
    vocab = max(tokenizer.get_vocab_size(with_added_tokens=True), max(tokenizer.get_vocab(True).values()) + 1)

    out = sys.stdout.buffer
    eos_bytes = eos_token.encode("utf-8")
    out.write(b"KEELTKZ1" + struct.pack("<QQI", vocab, eos_id, len(eos_bytes)) + eos_bytes)
    done_bytes = 0
    documents = 0
    batch, batch_bytes = [], 0

    def flush():
        nonlocal batch, batch_bytes
        if batch:
            encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
            lengths = array("I", [len(e.ids) for e in encodings])
            ids = array("I")
            for e in encodings:
                ids.extend(e.ids)
            if sys.byteorder != "little":
                lengths.byteswap()
                ids.byteswap()
            out.write(b"B" + struct.pack("<I", len(batch)) + lengths.tobytes() + ids.tobytes())
        out.write(b"P" + struct.pack("<Q", done_bytes))
        out.flush()
        batch, batch_bytes = [], 0

    for path in args.inputs:
        form = args.format
        if form == "auto":
            form = "jsonl" if path.endswith(JSONL_SUFFIXES) else "text"
        documents_of = jsonl_documents(path, args.field) if form == "jsonl" else text_documents(path, args.text_split)
        for text, consumed in documents_of:
            done_bytes += consumed
            if text is not None:
                batch.append(text)
                batch_bytes += len(text)
                documents += 1
            if len(batch) >= BATCH_DOCUMENTS or batch_bytes >= BATCH_BYTES:
                flush()
    flush()
    out.write(b"Z" + struct.pack("<Q", documents))
    out.flush()


if __name__ == "__main__":
    try:
        main()
    except BadInput as e:
        print(f"keel-data: {e}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # keel-data stopped reading: it reports why
        sys.exit(1)
    except OSError as e:
        print(f"keel-data: {e.filename}: {e.strerror}" if e.filename else f"keel-data: {e}", file=sys.stderr)
        sys.exit(2)
