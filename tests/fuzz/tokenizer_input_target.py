"""Fuzz target: keel-data's tokenizer step's readers (tools/keel-data/keel_tokenize.py), called as
the tool calls them. The first byte picks the reader, the rest is the file it reads:

  0  tokenizer_config.json beside a tokenizer.json      eos_from_config
  1  a JSONL input (field "text"), its documents encoded  jsonl_documents, encode_batch
  2  a plain-text input; the second byte picks the split  text_documents (file, paragraph, line)
  3  a tokenizer.json                                     load_tokenizer, resolve_eos, encode_batch

BadInput is the tool refusing bad bytes (keel-data prints one line, exit 2): a normal outcome.
Any other exception is a finding: the user would see a traceback.

Run by tools/fuzz with atheris (libFuzzer's engine for Python: `tools/fuzz 600 tokenizer_input`),
or without atheris on every file of folders, as ctest replays the seeds and kept crashers:

  tokenizer_input_target.py --replay DIR...
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "keel-data"))

import keel_tokenize  # noqa: E402  (after the path above)
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402

WORK = tempfile.mkdtemp(prefix="keel-fuzz-tokenizer-")
SPLITS = ("file", "paragraph", "line")


def fixed_tokenizer():
    """A small byte-level tokenizer that encodes any text, for the documents of modes 1 and 2."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.encode_special_tokens = True
    return tokenizer


TOKENIZER = fixed_tokenizer()


def write(name, data):
    path = os.path.join(WORK, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def encode_all(tokenizer, documents):
    texts, wheres = [], []
    for where, text, _consumed in documents:
        if text is not None:
            texts.append(text)
            wheres.append(where)
    if texts:
        keel_tokenize.encode_batch(tokenizer, texts, wheres)


def read(data):
    """Runs the reader `data` picks on the rest of it."""
    if not data:
        return
    mode, body = data[0] % 4, data[1:]
    if mode == 0:
        write("tokenizer.json", b"{}")
        write("tokenizer_config.json", body)
        keel_tokenize.eos_from_config(os.path.join(WORK, "tokenizer.json"))
    elif mode == 1:
        encode_all(TOKENIZER, keel_tokenize.jsonl_documents(write("input.jsonl", body), "text"))
    elif mode == 2:
        split = SPLITS[body[0] % 3] if body else "file"
        encode_all(TOKENIZER, keel_tokenize.text_documents(write("input.txt", body[1:]), split))
    else:
        try:
            os.remove(os.path.join(WORK, "tokenizer_config.json"))
        except FileNotFoundError:
            pass
        path = write("tokenizer.json", body)
        tokenizer = keel_tokenize.load_tokenizer(path, Tokenizer)
        tokenizer.encode_special_tokens = True
        keel_tokenize.resolve_eos(tokenizer, path, None)
        keel_tokenize.encode_batch(tokenizer, ["a document", "another"], [f"{path}:1", f"{path}:2"])


def test_one_input(data):
    try:
        read(bytes(data))
    except keel_tokenize.BadInput:
        pass


def replay(folders):
    """Runs the target on every file of `folders`; exit 1 at the first finding."""
    count = 0
    for folder in folders:
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if name.startswith(".") or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            try:
                test_one_input(data)
            except Exception:
                print(f"FINDING: {path}", file=sys.stderr)
                raise
            count += 1
    print(f"replayed {count} inputs without a finding")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--replay"]:
        replay(sys.argv[2:])
    else:
        import atheris

        atheris.instrument_all()  # coverage of the readers already imported, keel_tokenize's included
        atheris.Setup(sys.argv, test_one_input)
        atheris.Fuzz()
