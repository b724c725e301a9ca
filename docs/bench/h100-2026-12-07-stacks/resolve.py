#!/usr/bin/env python3
"""resolve.py DUMP_DIR: names the return addresses stackdump.so wrote (DUMP_DIR/<tid>, one
stack a dump, each begun by "--") from DUMP_DIR/maps and each mapped ELF file's symbol tables
(.symtab where the file keeps one, else .dynsym: for libcuda, the nearest exported symbol, which
names the entry point a frame is in only where that frame is in one). Writes DUMP_DIR/<tid>.txt,
one line a frame: address, file, symbol+offset, and prints one line a stack of each thread named
in DUMP_DIR/comm ("tid name" lines) whose name begins with PREFIX (all threads by default): the
innermost frames outside the handler and the innermost function of the main binary's own crate, then how many
stacks had each such pair. Standard library only."""
import bisect, os, re, struct, sys


def elf_symbols(path):
    """(load segments [(vaddr, offset, filesz)], sorted [(value, size, name)]) of an ELF64 file."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return [], []
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type == 1:
            loads.append((p_vaddr, p_offset, p_filesz))
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    by_type = {}
    for s in sections:
        by_type.setdefault(s[1], []).append(s)
    syms = []
    for table in (by_type.get(2) or by_type.get(11) or []):  # SHT_SYMTAB, else SHT_DYNSYM
        strtab = sections[table[6]]
        for k in range(table[5] // 24):
            st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, table[4] + k * 24)
            if st_info & 0xF in (1, 2) and st_shndx and st_value:  # object or function, defined
                end = data.index(b"\0", strtab[4] + st_name)
                syms.append((st_value, st_size, data[strtab[4] + st_name:end].decode(errors="replace")))
    syms.sort()
    return loads, syms


def demangle(name):
    """Rust's legacy mangling (_ZN...E) to a path, the hash dropped; other names as they are."""
    m = re.match(r"_ZN(.*)E$", re.sub(r"\.llvm\.\d+$", "", name))
    if not m:
        return name
    rest, parts = m.group(1), []
    while rest:
        n = re.match(r"(\d+)", rest)
        if not n:
            break
        k = int(n.group(1))
        part = rest[len(n.group(1)):len(n.group(1)) + k]
        rest = rest[len(n.group(1)) + k:]
        if not re.fullmatch(r"h[0-9a-f]{16}", part):
            parts.append(part.replace("$LT$", "<").replace("$GT$", ">").replace("$u20$", " ")
                         .replace("$C$", ",").replace("$u7b$", "{").replace("$u7d$", "}").replace("..", "::").replace("$RF$", "&"))
    return "::".join(parts)


def main(d, prefix=""):
    maps = []
    for line in open(os.path.join(d, "maps")):
        f = line.split()
        if len(f) >= 6 and f[5].startswith("/"):
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            maps.append((lo, hi, int(f[2], 16), f[5]))
    maps.sort()
    cache, summary = {}, []
    comm = dict(line.split(None, 1) for line in open(os.path.join(d, "comm"))) \
        if os.path.exists(os.path.join(d, "comm")) else {}
    # The main binary: the mapped file named as one of the process's threads is (the main
    # thread keeps the program's name); device files are mapped before it.
    names = {v.strip() for v in comm.values()}
    main_bin = next((os.path.basename(m[3]) for m in maps if os.path.basename(m[3]) in names),
                    os.path.basename(maps[0][3]) if maps else "")
    own = main_bin.replace("-", "_") + "::"  # the binary's own crate's functions
    for tid in sorted(os.listdir(d)):
        if not tid.isdigit():
            continue
        out = []
        for line in open(os.path.join(d, tid)):
            line = line.strip()
            if line == "--":
                out.append("--")
                continue
            a = int(line, 16)
            i = bisect.bisect_right(maps, (a, float("inf"))) - 1
            if i < 0 or not maps[i][0] <= a < maps[i][1]:
                out.append(f"{a:#x} ?")
                continue
            lo, _, off, path = maps[i]
            if path not in cache:
                try:
                    cache[path] = elf_symbols(path)
                except OSError:
                    cache[path] = ([], [])
            loads, syms = cache[path]
            fo = a - 1 - lo + off  # a return address: the call is the byte before it
            va = next((v + fo - o for v, o, s in loads if o <= fo < o + s), fo)
            j = bisect.bisect_right(syms, (va, float("inf"), "")) - 1
            name = f"{demangle(syms[j][2])}+{va - syms[j][0]:#x}" if j >= 0 else f"+{va:#x}"
            out.append(f"{a:#x} {os.path.basename(path)} {name}")
        with open(os.path.join(d, tid + ".txt"), "w") as f:
            f.write("\n".join(out) + "\n")
        name = comm.get(tid, "?").strip()
        if not name.startswith(prefix):
            continue
        for stack in "\n".join(out).split("--")[1:]:
            frames = [fr.split(" ", 1)[1] for fr in stack.strip().splitlines()[2:]]  # handler, trampoline
            inner = " < ".join(fr.split(" ", 1)[-1] for fr in frames[:3])
            ours = next((fr.split(" ", 1)[1] for fr in frames if fr.startswith(main_bin + " ")
                         and own in fr), "-")
            summary.append((tid, name, inner, re.sub(r"\+0x[0-9a-f]+$", "", ours)))
    for tid, name, inner, ours in summary:
        print(f"{tid} {name}: {inner} | {ours}")
    counts = {}
    for _, _, inner, ours in summary:
        key = (re.sub(r"\+0x[0-9a-f]+", "", inner), ours)
        counts[key] = counts.get(key, 0) + 1
    print("\nstacks  innermost frames | innermost function of " + own)
    for (inner, ours), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        print(f"{n:6d}  {inner} | {ours}")


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:3])
