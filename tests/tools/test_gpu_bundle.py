"""The GPU dependency bundle holds only the packages the gpu build needs, and fits what may travel.

  python3 tests/tools/test_gpu_bundle.py SOURCE_DIR

Checks, without downloading anything: the package list of tools/gpu-bundle (--list) against the
allowed set below; the committed sample manifest (a real tools/gpu-bundle output) and, where one
was made, SOURCE_DIR/.gpu/MANIFEST.tsv: only allowed packages, each once, files inside the bundle,
sizes and digests well-formed, and the bundle plus the working tree within the 64 MiB budget.
Exits 0 when every check holds; prints each failed check and exits 1 otherwise.
"""
import csv
import os
import re
import subprocess
import sys

# Why each package may travel (kept apart from tools/gpu-bundle so that a change there shows here).
ALLOWED = {
    "libboost1.74-dev": "Boost headers (Boost.DLL is header-only) and Boost's CMake config",
    "libboost-program-options1.74-dev": "Boost.Program_options CMake config and link library",
    "libboost-program-options1.74.0": "libboost_program_options.so.1.74.0 that keel-train runs with",
    "libtoml11-dev": "toml.hpp",
    "nlohmann-json3-dev": "nlohmann/json.hpp and its CMake config",
    "libxxhash-dev": "xxhash.h and libxxhash.so",
    "libxxhash0": "libxxhash.so.0 at run time",
    "libgtest-dev": "libgtest.a, libgtest_main.a and the GTest CMake config",
    "libgmock-dev": "the GMock targets the GTest CMake config includes",
    "libgloo-dev": "gloo headers that c10d's ProcessGroupGloo.hpp includes",
}
BUDGET = 64 * 1024 * 1024
COLUMNS = ["package", "version", "architecture", "file", "bytes", "sha256"]


def manifest_errors(rows, header):
    """Every way the manifest rows break the rules, as messages (empty when none)."""
    errors = []
    if header != COLUMNS:
        errors.append(f"columns {header}, expected {COLUMNS}")
    seen = set()
    for row in rows:
        package, file = row.get("package", ""), row.get("file", "")
        if package not in ALLOWED:
            errors.append(f"package {package!r} is not allowed in the bundle")
        if package in seen:
            errors.append(f"package {package!r} is listed twice")
        seen.add(package)
        if not re.fullmatch(r"debs/[A-Za-z0-9.+~_-]+\.deb", file):
            errors.append(f"{package}: file {file!r} is not a .deb inside debs/")
        if not re.fullmatch(r"[0-9]{1,10}", row.get("bytes", "")):
            errors.append(f"{package}: bytes {row.get('bytes')!r} is not a size")
        if not re.fullmatch(r"[0-9a-f]{64}", row.get("sha256", "")):
            errors.append(f"{package}: sha256 {row.get('sha256')!r} is not a digest")
        if row.get("architecture") not in ("amd64", "all"):
            errors.append(f"{package}: architecture {row.get('architecture')!r} does not run on x86-64")
    missing = set(ALLOWED) - seen
    if missing:
        errors.append(f"packages the gpu build needs are missing: {sorted(missing)}")
    return errors


def read(path):
    with open(path, newline="") as f:
        reader = csv.DictReader(f, delimiter="\t")
        return list(reader), reader.fieldnames


def tree_bytes(source):
    try:
        files = subprocess.run(["git", "-C", source, "ls-files", "-z"], capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = [os.path.join(source, p) for p in files.decode().split("\0") if p]
    return sum(os.lstat(p).st_size for p in paths if os.path.lexists(p))


def main():
    source = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    failures = []

    listed = subprocess.run([os.path.join(source, "tools", "gpu-bundle"), "--list"], capture_output=True, text=True,
                            check=True).stdout.split()
    extra = sorted(set(listed) - set(ALLOWED))
    missing = sorted(set(ALLOWED) - set(listed))
    if extra:
        failures.append(f"tools/gpu-bundle --list names packages that are not allowed: {extra}")
    if missing:
        failures.append(f"tools/gpu-bundle --list lacks packages the gpu build needs: {missing}")
    if len(listed) != len(set(listed)):
        failures.append("tools/gpu-bundle --list names a package twice")

    manifests = [os.path.join(source, "tests", "tools", "gpu_bundle_manifest.tsv")]
    if os.path.isfile(os.path.join(source, ".gpu", "MANIFEST.tsv")):
        manifests.append(os.path.join(source, ".gpu", "MANIFEST.tsv"))
    tree = tree_bytes(source)
    for path in manifests:
        rows, header = read(path)
        failures += [f"{path}: {e}" for e in manifest_errors(rows, header)]
        bundle = sum(int(r["bytes"]) for r in rows if r.get("bytes", "").isdigit())
        if tree is not None and bundle + tree > BUDGET:
            failures.append(f"{path}: bundle {bundle} B + working tree {tree} B exceed {BUDGET} B")
        print(f"{path}: {len(rows)} packages, {bundle / 2**20:.1f} MiB"
              + (f", with the working tree {(bundle + tree) / 2**20:.1f} of 64 MiB" if tree is not None else ""))

    # The checks reject what they are for: a package beyond the list, a path out of the bundle.
    rows, header = read(manifests[0])
    intruder = dict(rows[0], package="googletest", file="debs/googletest_1.12.1-0.2_all.deb")
    if not any("'googletest' is not allowed" in e for e in manifest_errors(rows + [intruder], header)):
        failures.append("a manifest with googletest (sources, not needed) was accepted")
    escape = [dict(rows[0], file="../../etc/passwd.deb")] + rows[1:]
    if not any("not a .deb inside debs/" in e for e in manifest_errors(escape, header)):
        failures.append("a manifest entry outside debs/ was accepted")

    for f in failures:
        print("FAIL: " + f)
    print(f"{len(failures)} failed checks")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
