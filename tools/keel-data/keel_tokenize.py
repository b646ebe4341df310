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
  'E'      u32 length + one line of UTF-8: the input was refused (may come before the header)
Bad input: one line naming the file (and line), exit status 2, no 'Z'; the line goes to stderr,
or with --refusal-record (keel-data's) into an 'E' record, which keel-data makes its own
one-line message. Every file is
opened through open_input (a FIFO, folder or device is refused, never waited on); whatever goes
wrong reading or parsing one (a JSON value nested too deeply for the parser, say) is bad input
there, and so is whatever the tokenizers library raises loading the tokenizer or encoding a
document (a Rust panic included: a pre-tokenizer regex exhausting its retry limit). Any other
failure is the tool's own: a traceback and exit status 1.
"""
import argparse
import contextlib
import json
import os
import stat
import struct
import sys
import tempfile
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
# Far above any published tokenizer.json (tens of MB) or tokenizer_config.json (kilobytes); a
# larger file is not one, and reading it whole could take any amount of memory.
MAX_TOKENIZER_BYTES = 1 << 30
MAX_CONFIG_BYTES = 64 << 20
# keel-data refuses a header whose EOS token is longer (tokenizer_process.cpp).
MAX_EOS_BYTES = 4096
# Exceptions that stop the tool rather than report a failure of the library's work.
NOT_FAILURES = (KeyboardInterrupt, SystemExit, GeneratorExit)


class BadInput(Exception):
    """The input's fault, not the tool's: reported in one line, exit status 2."""


def open_input(path, key, missing_ok=False):
    """`path` opened for binary reading, refused unless it is a regular file; None for a missing
    file when `missing_ok`. `key` names what pointed at the file, for the message."""
    try:  # without O_NONBLOCK, opening a FIFO would wait for a writer, forever
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise BadInput(f"{path}: no such file ({key})")
    except OSError as e:
        raise BadInput(f"{path}: cannot open ({key}): {e.strerror}")
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadInput(f"{path}: {file_kind(mode)}, not a regular file ({key})")
    return os.fdopen(fd, "rb")


def file_kind(mode):
    kinds = [(stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "not a file")


def read_input(path, key, limit, missing_ok=False):
    """The bytes of a whole input file, refused beyond `limit` bytes (see open_input)."""
    f = open_input(path, key, missing_ok)
    if f is None:
        return None
    with f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise BadInput(f"{path}: cannot read ({key}): {e.strerror}")
    if len(data) > limit:
        raise BadInput(f"{path}: larger than {limit >> 20} MiB ({key})")
    return data


def parse_json(data, where):
    """The JSON value of `data`; whatever the parser cannot read is bad input at `where`."""
    try:
        return json.loads(data)
    except UnicodeDecodeError as e:
        raise BadInput(f"{where}: not UTF-8 ({e.reason} at byte {e.start})")
    except RecursionError:  # the json module recurses once per nesting level
        raise BadInput(f"{where}: not a JSON value: nested too deeply")
    except ValueError as e:  # a syntax error, or an integer of more than 4300 digits
        raise BadInput(f"{where}: not a JSON value: {e}")


def described(error):
    """A library's exception as one line of a message: Rust errors span lines, and can be long."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= 300 else text[:300] + "..."


@contextlib.contextmanager
def library_stderr_held():
    """Standard error goes to a file while the library runs: a Rust panic prints its report (a
    stack too, under RUST_BACKTRACE) before it reaches Python as an exception, and the user is
    to get one line. What the library printed is passed on when the call returns."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        returned = False
        try:
            yield
            returned = True
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if returned and held.tell():
                held.seek(0)
                sys.stderr.buffer.write(held.read())
                sys.stderr.flush()


def library(what, function, *args, **kwargs):
    """`function(*args, **kwargs)` of the tokenizers library; what it raises is bad input, `what`
    saying where. A Rust panic arrives as pyo3's PanicException, a BaseException."""
    try:
        with library_stderr_held():
            return function(*args, **kwargs)
    except NOT_FAILURES:
        raise
    except BaseException as e:
        raise BadInput(f"{what}: {described(e)}")


def json_kind(value):
    """How a JSON value reads in a message: "an object", "a number", "null"."""
    kinds = {dict: "an object", list: "an array", str: "a string", bool: "true or false", type(None): "null"}
    return kinds.get(type(value), "a number")


def line_of(data, offset):
    return data.count(b"\n", 0, offset) + 1


def eos_from_config(tokenizer_path):
    """The eos_token of tokenizer_config.json next to tokenizer.json, if that file names one."""
    path = os.path.join(os.path.dirname(os.path.abspath(tokenizer_path)), "tokenizer_config.json")
    data = read_input(path, "the tokenizer_config.json beside --tokenizer", MAX_CONFIG_BYTES, missing_ok=True)
    if data is None:
        return None
    config = parse_json(data, path)
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
    with open_input(path, "--input") as f:
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
    """Yields (where, text or None, bytes consumed in this file) for each line of a JSONL file."""
    for where, raw in numbered_lines(path):
        yield where, (jsonl_text(raw, where, field) if raw.strip() else None), len(raw)


def jsonl_text(raw, where, field):
    """The document of one JSONL line; whatever goes wrong reading the line is bad input there."""
    try:
        return parse_jsonl_line(raw, where, field)
    except BadInput:
        raise
    except Exception as e:  # e.g. MemoryError: the line, not the tool, is at fault
        raise BadInput(f"{where}: cannot read the line: {type(e).__name__}: {e}")


def parse_jsonl_line(raw, where, field):
    record = parse_json(raw, where)
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
    """Yields (where, text or None, bytes consumed in this file) for a plain-text file's documents."""
    if split == "file":
        text, size = whole_file(path)
        yield path, text, size
        return
    # Line by line, so a large file streams: a document is a non-blank line, or a paragraph
    # (lines that are not blank, up to a blank line or the end), without its final line break.
    paragraph, first = [], None
    for where, raw in numbered_lines(path):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise BadInput(f"{where}: not UTF-8 ({e.reason} at byte {e.start} of the line)")
        blank = not line.strip()
        if split == "line":
            yield where, (None if blank else line.rstrip("\r\n")), len(raw)
        elif not blank:
            first = first if paragraph else where
            paragraph.append(line)
            yield where, None, len(raw)
        else:
            yield first, ("".join(paragraph).rstrip("\r\n") if paragraph else None), len(raw)
            paragraph = []
    if paragraph:
        yield first, "".join(paragraph).rstrip("\r\n"), 0


def whole_file(path):
    """A plain-text file as one document: its exact text, and its size."""
    with open_input(path, "--input") as f:
        size = os.fstat(f.fileno()).st_size
        if size > LARGE_DOCUMENT:
            print(f"keel-data: warning: {path} is one document of {size / 1e6:.0f} MB; the library encodes a "
                  f"document whole, at about {MEMORY_PER_BYTE} bytes of memory per byte of text (--text-split "
                  "paragraph, or JSONL, makes smaller documents)", file=sys.stderr)
        try:
            data = f.read()
        except OSError as e:
            raise BadInput(f"{path}: cannot read: {e.strerror or e}")
    try:
        return data.decode("utf-8"), len(data)
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}:{line_of(data, e.start)}: not UTF-8 ({e.reason} at byte {e.start})")


def load_tokenizer(path, tokenizer_class):
    """The tokenizer of a tokenizer.json, read here (not by the library's from_file) so that the
    file is opened and checked like any input."""
    data = read_input(path, "--tokenizer", MAX_TOKENIZER_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"{path}:{line_of(data, e.start)}: not UTF-8 ({e.reason} at byte {e.start})")
    return library(f"{path}: not a tokenizer.json the tokenizers library reads", tokenizer_class.from_str, text)


def encode_batch(tokenizer, texts, wheres):
    """The library's encodings of a batch of documents; a document it fails on is bad input,
    named by `wheres` (the library does not say which one it was)."""
    try:
        with library_stderr_held():
            return tokenizer.encode_batch(texts, add_special_tokens=False)
    except NOT_FAILURES:
        raise
    except BaseException as e:
        failure = e
    for text, where in zip(texts, wheres):
        library(f"{where}: the tokenizer cannot encode this document", tokenizer.encode, text,
                add_special_tokens=False)
    raise BadInput(f"{wheres[0]}: the tokenizer cannot encode this batch of {len(texts)} documents, each of them "
                   f"alone encodes: {described(failure)}")


def main():
    parser = argparse.ArgumentParser(description="keel-data's tokenizer step (see the module docstring)")
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--eos")
    parser.add_argument("--format", choices=["auto", "text", "jsonl"], default="auto")
    parser.add_argument("--field", default="text")
    parser.add_argument("--text-split", choices=["file", "paragraph", "line"], default="file")
    parser.add_argument("--refusal-record", action="store_true",
                        help="report bad input as an 'E' record on standard output (keel-data reads it)")
    parser.add_argument("inputs", nargs="+")
    args = parser.parse_args()
    try:
        import tokenizers
    except ImportError as e:
        raise BadInput(f"the Python package 'tokenizers' is needed for --tokenizer ({e}); "
                       "install it, or point KEEL_PYTHON at an interpreter that has it")
    tokenizer = load_tokenizer(args.tokenizer, tokenizers.Tokenizer)
    # add_special_tokens=False does not stop special-token text in a document from matching the
    # special token itself: an EOS inside a document would cut it in two.
    if not hasattr(tokenizer, "encode_special_tokens"):
        raise BadInput(f"the Python package 'tokenizers' {tokenizers.__version__} cannot encode special-token text "
                       "literally; --tokenizer needs tokenizers 0.19 or later")
    tokenizer.encode_special_tokens = True
    eos_token, eos_id = resolve_eos(tokenizer, args.tokenizer, args.eos)
    # Added tokens may sit above the base vocabulary; every id must be below the recorded size.
    vocab = max(tokenizer.get_vocab_size(with_added_tokens=True), max(tokenizer.get_vocab(True).values()) + 1)

    eos_bytes = eos_token.encode("utf-8")
    if len(eos_bytes) > MAX_EOS_BYTES:
        raise BadInput(f"{args.tokenizer}: the EOS token {eos_token[:40]!r}... is {len(eos_bytes)} bytes long; keel-data "
                       f"takes at most {MAX_EOS_BYTES}")
    out = sys.stdout.buffer
    out.write(b"KEELTKZ1" + struct.pack("<QQI", vocab, eos_id, len(eos_bytes)) + eos_bytes)
    done_bytes = 0
    documents = 0
    batch, batch_where, batch_bytes = [], [], 0

    def flush():
        nonlocal batch, batch_where, batch_bytes
        if batch:
            encodings = encode_batch(tokenizer, batch, batch_where)
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
        batch, batch_where, batch_bytes = [], [], 0

    for path in args.inputs:
        form = args.format
        if form == "auto":
            form = "jsonl" if path.endswith(JSONL_SUFFIXES) else "text"
        documents_of = jsonl_documents(path, args.field) if form == "jsonl" else text_documents(path, args.text_split)
        for where, text, consumed in documents_of:
            done_bytes += consumed
            if text is not None:
                batch.append(text)
                batch_where.append(where)
                batch_bytes += len(text)
                documents += 1
            if len(batch) >= BATCH_DOCUMENTS or batch_bytes >= BATCH_BYTES:
                flush()
    flush()
    out.write(b"Z" + struct.pack("<Q", documents))
    out.flush()


def refuse(message):
    """Reports bad input and exits 2: to keel-data as an 'E' record (it prints the one line, with
    what it did not write), or on stderr to someone running this script by hand. Read from the
    command line itself: the refusal may come from before or during its parsing."""
    line = " ".join(message.splitlines())
    if "--refusal-record" not in sys.argv[1:sys.argv.index("--") if "--" in sys.argv else len(sys.argv)]:
        print("keel-data: " + line, file=sys.stderr)
    else:
        data = line.encode("utf-8", "replace")[:4096].decode("utf-8", "ignore").encode("utf-8")
        sys.stdout.buffer.write(b"E" + struct.pack("<I", len(data)) + data)
        sys.stdout.buffer.flush()
    sys.exit(2)


if __name__ == "__main__":
    try:
        main()
    except BadInput as e:  # the one place input errors become a message; anything else is a bug
        refuse(str(e))
    except BrokenPipeError:  # keel-data stopped reading: it reports why
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C reaches keel-data too, which reports the stop
        sys.exit(130)
    except OSError as e:
        refuse(f"{e.filename}: {e.strerror}" if e.filename else str(e))
