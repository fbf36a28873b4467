# Sourced by the one-call GPU scripts: pack RESULT OUT WORK writes the folder RESULT as one tar (kept in WORK),
# split into 15 MiB parts OUT/result.tar.part-NN with its sha256 in OUT/result.tar.sha256, replacing any earlier
# parts; a device returns at most 8 files of at most 16 MiB each, and `cat result.tar.part-* | tar -x` unpacks it.
pack() {
    rm -f "$2"/result.tar.part-*
    tar -C "$1" -cf "$3/result.tar" .
    sha256sum "$3/result.tar" | cut -d' ' -f1 >"$2/result.tar.sha256"
    split -b 15M -d "$3/result.tar" "$2/result.tar.part-"
}
