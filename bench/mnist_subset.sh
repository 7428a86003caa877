# Sourced by bench/*.sh: subset K DIR writes the first K training samples of
# $data (an MNIST-format folder; IDX, gzipped or not) into DIR with their
# header's count rewritten, and copies the whole test split beside them.
subset() {
    mkdir -p "$2"
    for f in images-idx3:16:784 labels-idx1:8:1; do
        name=${f%%:*} rest=${f#*:}
        hdr=${rest%%:*} per=${rest#*:}
        src=$data/train-$name-ubyte.gz
        [ -f "$src" ] || src=$data/train-$name-ubyte
        { zcat -f "$src" | head -c "$hdr" | perl -e 'read STDIN, $h, 16; my @v = unpack("N*", $h);
              $v[1] = $ARGV[0]; print pack("N*", @v)' "$1"
          zcat -f "$src" | tail -c +$((hdr + 1)) | head -c $(($1 * per)); } >"$2/train-$name-ubyte"
        cp "$data"/t10k-$name-ubyte* "$2/"
    done
}
