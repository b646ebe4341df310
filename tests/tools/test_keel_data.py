"""keel-data build --tokenizer: ids equal the tokenizers library's own encoding, the header
records vocabulary, EOS id and documents, the output is deterministic, bad input is refused.

  python3 tests/tools/test_keel_data.py BIN_DIR PLUGIN_DIR WORK_DIR [--hostile-only]

Trains a small byte-level BPE tokenizer.json with `tokenizers` on a corpus written here, builds
token files from plain text and JSONL with keel-data, parses each header here, and compares
every document's ids with `Tokenizer.encode(doc, add_special_tokens=False).ids` + [EOS], with
encode_special_tokens set (special-token text in a document is text: one EOS per document; the
ids of other documents are checked equal to the default encoding). A file keel-data wrote then
trains the tiny llama3 for two steps. Hostile tokenizer files and inputs (deep JSON, a FIFO or a
folder in place of a file, a pre-tokenizer regex the library panics on) are each refused within
seconds in one line naming the file, through keel-data and, where keel-data itself would not
reach the tokenizer step, by keel_tokenize.py run directly (--hostile-only runs just these).
Exits 0 when every check holds; prints each failed check and exits 1 otherwise.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|endoftext|>", "<pad>", "<|eos|>"]
# Multi-byte UTF-8, a tab, a carriage return and leading spaces: text a byte-level BPE splits in
# interesting places.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Grüße aus Köln: naïve café, déjà vu — 日本語のテキスト。",
    "  indented\tline with a tab\r\nand a CRLF ending",
    "Numbers 3.14159 and 2718 and emoji 🙂🚀 in one line.",
    "def f(x):\n    return x * 2  # code is text too",
]


def make_tokenizer(path, specials):
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(SENTENCES * 20, trainer)
    tokenizer.save(path)
    return Tokenizer.from_file(path)


def run_bounded(command, merge=True, env=None):
    """`command` run to its end, its output as text (standard error merged unless `merge` is
    false). A run still going after 60 s is killed with its children (keel_tokenize.py waiting
    on a FIFO must not hang the test) and reads as exit status None."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                          text=True, errors="replace", start_new_session=True, env=env) as p:
        try:
            out, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            return subprocess.CompletedProcess(command, None, out + "\n(killed: still running after 60 s)", err)
    return subprocess.CompletedProcess(command, p.returncode, out, err)


def check_hostile_inputs(keel_data, script, work, tokenizer_json, check):
    """Hostile tokenizer files and inputs: each refused with exit status 2 in one line naming the
    file and what pointed at it (keel-data's own line, saying the output was not written, carries
    the tokenizer step's refusal), no traceback, no Rust panic report, within seconds."""
    os.makedirs(work)

    def path(name):
        return os.path.join(work, name)

    def refused(r, output, why, lines, what):
        check(r.returncode == 2 and why in output, f"{what}: exit {r.returncode}, expected 2 with {why!r}: "
                                                   f"{output[-2000:]}")
        check("Traceback" not in output and "panicked" not in output,
              f"{what}: a traceback or panic report instead of a message: {output[-2000:]}")
        check(output.count("\n") == lines, f"{what}: {output.count(chr(10))} lines, expected {lines}: {output[-2000:]}")

    def build(tokenizer, inputs, what, why, env=None):
        r = run_bounded([keel_data, "build", "--tokenizer", tokenizer, "--input", *inputs, "--output",
                         path("hostile.tok")], env=env)
        refused(r, r.stdout, why, 1, what)
        check("hostile.tok not written" in r.stdout, f"{what}: the refusal does not say the output was not written")
        check(not os.path.exists(path("hostile.tok")), f"{what}: a token file was written")

    def tokenize(tokenizer, inputs, what, why):
        """keel_tokenize.py by itself, where keel-data does not start it for this input."""
        r = run_bounded([sys.executable, script, "--tokenizer", tokenizer, "--", *inputs], merge=False)
        refused(r, r.stderr, why, 1, what)

    document = path("one.jsonl")
    with open(document, "w") as f:
        f.write('{"text": "a"}\n')

    def beside(name, make_config):
        """A copy of the tokenizer in its own folder, `make_config` making its tokenizer_config.json."""
        os.makedirs(path(name))
        shutil.copy(tokenizer_json, path(name))
        make_config(os.path.join(path(name), "tokenizer_config.json"))
        return os.path.join(path(name), "tokenizer.json")

    def write_deep(config):
        with open(config, "w") as f:
            f.write('{"eos_token": ' + "[" * 100000 + "]" * 100000 + "}")

    build(beside("deep_config", write_deep), [document], "tokenizer_config.json nested 100000 deep",
          "tokenizer_config.json: not a JSON value: nested too deeply")
    build(beside("fifo_config", os.mkfifo), [document], "tokenizer_config.json a FIFO",
          "tokenizer_config.json: a FIFO, not a regular file (the tokenizer_config.json beside --tokenizer)")
    build(beside("folder_config", os.makedirs), [document], "tokenizer_config.json a folder",
          "tokenizer_config.json: a folder, not a regular file (the tokenizer_config.json beside --tokenizer)")
    os.makedirs(path("folder_tokenizer/tokenizer.json"))
    build(path("folder_tokenizer/tokenizer.json"), [document], "tokenizer.json a folder",
          "--tokenizer: " + path("folder_tokenizer/tokenizer.json") + ": is a folder, expected a regular file")
    os.makedirs(path("fifo_tokenizer"))
    os.mkfifo(path("fifo_tokenizer/tokenizer.json"))
    build(path("fifo_tokenizer/tokenizer.json"), [document], "tokenizer.json a FIFO",
          "--tokenizer: " + path("fifo_tokenizer/tokenizer.json") + ": is a FIFO, expected a regular file")
    os.symlink("/dev/zero", path("device.jsonl"))
    build(tokenizer_json, [document, path("device.jsonl")], "input a device",
          "--input: " + path("device.jsonl") + ": is a character device, expected a regular file")
    # keel-data refuses these itself: the tokenizer step's own refusal is checked by running it
    # directly.
    tokenize(path("fifo_tokenizer/tokenizer.json"), [document], "tokenizer.json a FIFO (the step alone)",
             "tokenizer.json: a FIFO, not a regular file (--tokenizer)")
    os.mkfifo(path("fifo.jsonl"))
    tokenize(tokenizer_json, [document, path("fifo.jsonl")], "input a FIFO (the step alone)",
             "fifo.jsonl: a FIFO, not a regular file (--input)")
    os.makedirs(path("folder.txt"))
    tokenize(tokenizer_json, [path("folder.txt")], "input a folder (the step alone)",
             "folder.txt: a folder, not a regular file (--input)")

    # A pre-tokenizer regex that backtracks past Oniguruma's retry limit on one document: the
    # library panics (pyo3's PanicException, a BaseException), printing a report and, under
    # RUST_BACKTRACE, a stack.
    os.makedirs(path("panic"))
    panicky = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    panicky.pre_tokenizer = pre_tokenizers.Split(Regex("(a|aa)*c"), behavior="isolated")
    panicky.add_special_tokens(["<|endoftext|>"])
    panicky.save(path("panic/tokenizer.json"))
    with open(path("panic.jsonl"), "w") as f:
        f.write(json.dumps({"text": "fine"}) + "\n" + json.dumps({"text": "b" + "a" * 40 + "b c"}) + "\n")
    build(path("panic/tokenizer.json"), [path("panic.jsonl")], "regex past its retry limit",
          "panic.jsonl:2: the tokenizer cannot encode this document: PanicException",
          env=dict(os.environ, RUST_BACKTRACE="1"))


def check_interrupted_and_failing_writes(keel_data, work, tokenizer_json, check):
    """SIGINT, SIGTERM and a full disk in the middle of a build: exit 130, 143 or 1, the previous
    output intact and no staging file left. An input that is the output's staging file is
    refused before anything is truncated. The faults come from tests/support/write_fault.c,
    preloaded, at a chosen byte of the staging file's writes."""
    os.makedirs(work)
    library = os.environ["KEEL_WRITE_FAULT_LIBRARY"]
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write("".join(f"{SENTENCES[i % len(SENTENCES)]} #{i}\n\n" for i in range(20000)))
    out = os.path.join(work, "out.tok")
    for tokenized in (False, True):
        for action, status in (("sigint", 130), ("sigterm", 143), ("enospc", 1)):
            what = f"{'tokenized' if tokenized else 'byte-level'} build, {action} after 1 MB"
            with open(out, "w") as f:
                f.write("previous")
            env = dict(os.environ, LD_PRELOAD=library, KEEL_WRITE_FAULT=f"{action}:{1 << 20}:{out}.partial")
            args = ["--tokenizer", tokenizer_json, "--text-split", "paragraph"] if tokenized else []
            r = run_bounded([keel_data, "build", *args, "--input", corpus, corpus, "--output", out], env=env)
            check(r.returncode == status, f"{what}: exit {r.returncode}, expected {status}: {r.stdout[-2000:]}")
            check("Traceback" not in r.stdout, f"{what}: a traceback: {r.stdout[-2000:]}")
            with open(out) as f:
                check(f.read() == "previous", f"{what}: the previous output was replaced")
            check(not os.path.exists(out + ".partial"), f"{what}: the staging file was left")
    staging = out + ".partial"
    shutil.copy(corpus, staging)
    r = run_bounded([keel_data, "build", "--input", staging, "--output", out])
    check(r.returncode == 2 and "staging file" in r.stdout,
          f"input is the staging file: exit {r.returncode}, expected 2 naming it: {r.stdout[-2000:]}")
    with open(staging) as a, open(corpus) as b:
        check(a.read() == b.read(), "input is the staging file: the input was destroyed")


def read_token_file(path):
    """(header fields, token ids) of a KEELTOK2 file, parsed here independently of Keel."""
    with open(path, "rb") as f:
        data = f.read()
    magic = data[:8]
    width, flags, num_tokens, vocab, eos, documents = struct.unpack("<IIQQQQ", data[8:48])
    payload = data[48:]
    assert len(payload) == num_tokens * width, f"{path}: {len(payload)} payload bytes for {num_tokens} tokens"
    ids = list(struct.unpack(f"<{num_tokens}{'H' if width == 2 else 'I'}", payload))
    return {"magic": magic, "width": width, "flags": flags, "num_tokens": num_tokens, "vocab": vocab, "eos": eos,
            "documents": documents}, ids


def main():
    bin_dir, plugin_dir, work = sys.argv[1:4]
    hostile_only = sys.argv[4:] == ["--hostile-only"]
    keel_data = os.path.join(bin_dir, "keel-data")
    # Where keel-data finds its tokenizer step (tokenizer_process.cpp), in the build and install trees.
    script = os.path.join(bin_dir, os.pardir, "share", "keel", "keel_tokenize.py")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    failures = []

    def check(condition, what):
        if not condition:
            failures.append(what)

    def path(name):
        return os.path.join(work, name)

    def build(*args):
        return run_bounded([keel_data, "build", *args])

    def finish():
        for f in failures:
            print("FAILED:", f)
        print(f"keel-data: {'all checks passed' if not failures else f'{len(failures)} check(s) failed'}")
        sys.exit(1 if failures else 0)

    def write(name, text):
        with open(path(name), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        return path(name)

    def expect_file(out, tokenizer, documents, eos, what):
        """The token file holds exactly `documents`, each encoded by the library then EOS."""
        header, ids = read_token_file(out)
        # Document text is encoded literally: special-token text in it is text, never a special token.
        literal = Tokenizer.from_str(tokenizer.to_str())
        literal.encode_special_tokens = True
        expected = []
        for doc in documents:
            doc_ids = literal.encode(doc, add_special_tokens=False).ids
            if not any(special in doc for special in SPECIALS):
                check(doc_ids == tokenizer.encode(doc, add_special_tokens=False).ids,
                      f"{what}: literal encoding differs from the library's default for {doc!r}")
            expected += doc_ids + [eos]
        check(ids.count(eos) == len(documents) == header["documents"],
              f"{what}: {ids.count(eos)} EOS ids, {header['documents']} documents in the header, "
              f"{len(documents)} expected")
        check(header["magic"] == b"KEELTOK2", f"{what}: magic {header['magic']!r}")
        check(header["flags"] == 1, f"{what}: flags {header['flags']}, expected 1 (EOS id recorded)")
        check(header["vocab"] == tokenizer.get_vocab_size(with_added_tokens=True),
              f"{what}: vocabulary {header['vocab']}, expected {tokenizer.get_vocab_size(with_added_tokens=True)}")
        check(header["width"] == 2, f"{what}: {header['width']} bytes per token for a vocabulary of {header['vocab']}")
        check(header["eos"] == eos, f"{what}: EOS id {header['eos']}, expected {eos}")
        check(header["documents"] == len(documents), f"{what}: {header['documents']} documents, expected {len(documents)}")
        check(ids == expected, f"{what}: ids differ from the library's encoding (first difference at "
                               f"{next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), min(len(ids), len(expected)))}"
                               f", {len(ids)} vs {len(expected)} tokens)")

    tokenizer_json = path("tokenizer.json")
    tokenizer = make_tokenizer(tokenizer_json, SPECIALS)
    endoftext = tokenizer.token_to_id("<|endoftext|>")
    if hostile_only:
        check_hostile_inputs(keel_data, script, path("hostile"), tokenizer_json, check)
        finish()

    # Special-token text inside a document is text: one EOS id per document, at its end.
    specials_jsonl = write("specials.jsonl", '{"text": "hello <|endoftext|> world"}\n{"text": "<|endoftext|>"}\n'
                                             '{"text": "a <pad> and <|eos|>"}\n')
    r = build("--tokenizer", tokenizer_json, "--input", specials_jsonl, "--output", path("specials.tok"))
    check(r.returncode == 0, f"special-token text: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(path("specials.tok"), tokenizer, ["hello <|endoftext|> world", "<|endoftext|>",
                                                      "a <pad> and <|eos|>"], endoftext, "special-token text")

    # Plain text (one document per file) and JSONL (one per line, a blank line skipped, more
    # documents than one batch of the tokenizer step holds) in one build, in input order.
    text_doc = "\n".join(SENTENCES) + "\n"
    txt = write("story.txt", text_doc)
    jsonl_docs = [SENTENCES[i % len(SENTENCES)] + f" #{i}" for i in range(2500)] + ["", "<|endoftext|> is text here"]
    lines = [json.dumps({"id": i, "text": d}, ensure_ascii=i % 2 == 0) for i, d in enumerate(jsonl_docs)]
    lines.insert(7, "")
    jsonl = write("docs.jsonl", "\n".join(lines) + "\n")
    out = path("mixed.tok")
    r = build("--tokenizer", tokenizer_json, "--input", txt, jsonl, "--output", out)
    check(r.returncode == 0, f"text + JSONL build: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(out, tokenizer, [text_doc] + jsonl_docs, endoftext, "text + JSONL")
        check(f"{len(jsonl_docs) + 1} documents" in r.stdout, f"summary: {r.stdout!r}")
        check('EOS id %d "<|endoftext|>"' % endoftext in r.stdout, f"summary: {r.stdout!r}")
        again = path("mixed_again.tok")
        r2 = build("--tokenizer", tokenizer_json, "--input", txt, jsonl, "--output", again)
        with open(out, "rb") as a, open(again, "rb") as b:
            check(r2.returncode == 0 and a.read() == b.read(), "the same input built twice differs")

    # Plain text split into paragraphs and into lines; a JSONL field other than "text".
    paragraphs = write("paragraphs.txt", "first paragraph\nstill first\n\n\n  second one  \n\nthird\n")
    r = build("--tokenizer", tokenizer_json, "--input", paragraphs, "--output", path("para.tok"), "--text-split",
              "paragraph")
    check(r.returncode == 0, f"paragraphs: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(path("para.tok"), tokenizer, ["first paragraph\nstill first", "  second one  ", "third"],
                    endoftext, "paragraphs")
    r = build("--tokenizer", tokenizer_json, "--input", paragraphs, "--output", path("lines.tok"), "--text-split",
              "line")
    check(r.returncode == 0, f"lines: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(path("lines.tok"), tokenizer, ["first paragraph", "still first", "  second one  ", "third"],
                    endoftext, "lines")
    body = write("body.jsonl", json.dumps({"body": "field named body", "text": 1}) + "\n")
    r = build("--tokenizer", tokenizer_json, "--input", body, "--output", path("body.tok"), "--field", "body")
    check(r.returncode == 0, f"--field body: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(path("body.tok"), tokenizer, ["field named body"], endoftext, "--field body")

    # The EOS: --eos, then tokenizer_config.json's eos_token, then a common special token.
    r = build("--tokenizer", tokenizer_json, "--input", body, "--field", "body", "--output", path("eos.tok"), "--eos",
              "<|eos|>")
    check(r.returncode == 0, f"--eos: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(path("eos.tok"), tokenizer, ["field named body"], tokenizer.token_to_id("<|eos|>"), "--eos")
    configured = path("configured")
    os.makedirs(configured)
    shutil.copy(tokenizer_json, configured)
    with open(os.path.join(configured, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": {"content": "<pad>", "special": True}}, f)
    r = build("--tokenizer", os.path.join(configured, "tokenizer.json"), "--input", body, "--field", "body",
              "--output", path("config_eos.tok"))
    check(r.returncode == 0, f"tokenizer_config.json eos_token: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        expect_file(path("config_eos.tok"), tokenizer, ["field named body"], tokenizer.token_to_id("<pad>"),
                    "tokenizer_config.json eos_token")

    # The byte-level build still works, as a KEELTOK2 file without an EOS id.
    r = build("--input", txt, "--output", path("bytes.tok"))
    check(r.returncode == 0, f"byte-level: exit {r.returncode}: {r.stdout}")
    if r.returncode == 0:
        header, ids = read_token_file(path("bytes.tok"))
        check(header["flags"] == 0 and header["vocab"] == 256 and header["documents"] == 0,
              f"byte-level header: {header}")
        check(ids == list(text_doc.encode("utf-8")), "byte-level ids are not the file's bytes")

    # Bad input: exit 2, the problem named, the existing output untouched and no partial file.
    no_eos_dir = path("no_eos")
    os.makedirs(no_eos_dir)
    make_tokenizer(os.path.join(no_eos_dir, "tokenizer.json"), ["<pad>"])
    bad = {
        "missing field": (["--input", write("nofield.jsonl", '{"text": "a"}\n{"body": "b"}\n')],
                          "nofield.jsonl:2: no field 'text'"),
        "bad JSON line": (["--input", write("broken.jsonl", '{"text": "a"}\n{"text": "a"}\n{"text": "b\n')],
                          "broken.jsonl:3: not a JSON value"),
        "non-string field": (["--input", write("number.jsonl", '{"text": 5}\n')],
                             "number.jsonl:1: field 'text' is a number, not a string"),
        "lone surrogate": (["--input", write("surrogate.jsonl", '{"text": "a"}\n{"text": "x\\ud800y"}\n')],
                           "surrogate.jsonl:2: field 'text' holds '\\ud800', not Unicode text"),
        "not an object": (["--input", write("array.jsonl", '["text"]\n')], "array.jsonl:1: an array"),
        "JSON nested too deeply": (["--input", write("deep.jsonl", '{"text": "a"}\n' + "[" * 100000 + "\n")],
                                   "deep.jsonl:2: "),
        "not UTF-8 text": (["--input", path("latin1.txt")], "latin1.txt:2: not UTF-8"),
        "not UTF-8 paragraphs": (["--text-split", "paragraph", "--input", path("latin1.txt")],
                                 "latin1.txt:2: not UTF-8"),
        "missing tokenizer": (["--tokenizer", path("none/tokenizer.json"), "--input", txt],
                              "--tokenizer: " + path("none/tokenizer.json") + ": cannot open"),
        "not a tokenizer": (["--tokenizer", txt, "--input", txt], "not a tokenizer.json"),
        "unknown --eos": (["--eos", "<|nope|>", "--input", txt], "--eos: '<|nope|>' is not a token of"),
        "no EOS found": (["--tokenizer", os.path.join(no_eos_dir, "tokenizer.json"), "--input", txt],
                         "no EOS token found"),
        "missing input": (["--input", txt, path("absent.txt")], "--input: " + path("absent.txt") + ": cannot open"),
        "bad --format": (["--format", "csv", "--input", txt], "--format: csv is not auto, text or jsonl"),
    }
    with open(path("latin1.txt"), "wb") as f:
        f.write(b"fine line\ncaf\xe9\n")
    for name, (args, why) in bad.items():
        out = path("kept.tok")
        with open(out, "w") as f:
            f.write("previous")
        if "--tokenizer" not in args:
            args = ["--tokenizer", tokenizer_json] + args
        r = build(*args, "--output", out)
        check(r.returncode == 2 and why in r.stdout, f"{name}: exit {r.returncode}, expected 2 with {why!r}: {r.stdout}")
        check("Traceback" not in r.stdout, f"{name}: the refusal is a Python traceback: {r.stdout[-2000:]}")
        check("kept.tok not written" in r.stdout, f"{name}: the refusal does not say the output was not written")
        with open(out) as f:
            check(f.read() == "previous", f"{name}: the existing output was replaced")
        check(not os.path.exists(out + ".partial"), f"{name}: a partial file was left")

    r = build("--tokenizer", tokenizer_json, "--input", txt, "--output", no_eos_dir)
    check(r.returncode == 2 and "is a folder" in r.stdout, f"output is a folder: exit {r.returncode}: {r.stdout}")
    check_hostile_inputs(keel_data, script, path("hostile"), tokenizer_json, check)
    check_interrupted_and_failing_writes(keel_data, path("faults"), tokenizer_json, check)

    # A tokenized file trains (the tiny llama3, its vocabulary raised to the tokenizer's).
    if os.path.exists(path("mixed.tok")):
        job = write("job.toml", f"""[model]
plugin = "llama3"
[model.llama3]
flavor = "tiny"
vocab_size = {tokenizer.get_vocab_size(with_added_tokens=True)}
[training]
steps = 2
seq_len = 32
global_batch = 2
threads = 1
[checkpoint]
save_final = false
[data]
source = "tokens"
path = "{path("mixed.tok")}"
""")
        train = subprocess.run([os.path.join(bin_dir, "keel-train"), "--config", job, "--plugin-path", plugin_dir,
                                "--set", f'job.run_dir="{path("run")}"'],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        check(train.returncode == 0, f"training on the token file: exit {train.returncode}: {train.stdout[-2000:]}")
        check(f"EOS id {endoftext}, {len(jsonl_docs) + 1} documents" in train.stdout,
              f"the run does not describe the file's EOS id and documents: {train.stdout[-2000:]}")
    finish()


if __name__ == "__main__":
    main()
