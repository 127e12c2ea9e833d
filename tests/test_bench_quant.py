"""The quantization suite of the benchmark (wgrad.bench.quant), without a GPU: its segment splits and the
size of the copy it times beside every cast."""

from itertools import accumulate

from wgrad.bench.quant import bytes_moved, reference_copy_size, segment_sizes


def test_segment_sizes():
    # The quantization bench's segment splits: uneven, summing to R; unaligned by default (every segment but
    # the first starts inside a 32-byte sector, as random sizes do), or rounded to multiples of `align`
    # (colwise_segments16: what the k-grouped GEMM takes).
    for rows in (4096, 8192, 16384):
        starts = list(accumulate(segment_sizes(rows, 8)))[:-1]
        assert all(s % 32 for s in starts), (rows, starts)
        for align in (1, 16, 128):
            sizes = segment_sizes(rows, 8, align)
            assert len(sizes) == 8 and sum(sizes) == rows and min(sizes) > 0 and len(set(sizes)) > 1
            if align > 1:
                assert all(s % align == 0 for s in sizes), (rows, align, sizes)
        assert any(s % 16 for s in segment_sizes(rows, 8))


def test_reference_copy_size():
    # The copy beside each quantization kernel moves at least the kernel's bytes, in a size that is a
    # multiple of 64 KiB (the driver's copy runs 3-13 % slower at sizes that are not multiples of 4 KiB,
    # which flattered the segments casts' % of a copy), and never more than 128 KiB beyond them.
    for rows, cols in ((4096, 7168), (8192, 2112), (8192, 4224), (8192, 4096)):
        for kind in ("rowwise", "colwise", "both", "colwise_segments", "colwise_segments_pad32",
                     "both_segments_pad32"):
            nbytes = bytes_moved(kind, rows, cols, 2, 8)
            n = reference_copy_size(nbytes)
            assert n % (64 * 1024) == 0 and nbytes <= 2 * n < nbytes + 128 * 1024 + 2, (rows, cols, kind, nbytes, n)
    # 8192 x 4224 segments: 52,504,320 bytes each way; the copy 52,559,872 (802 x 64 KiB).
    assert reference_copy_size(2 * 52504320) == 52559872 and reference_copy_size(2 * 65536) == 65536


def test_both_segments_bytes():
    # Both over padded segments moves x once, the padded column-wise outputs and the row-wise ones.
    rows, cols = 8192, 2112
    both = bytes_moved("both_segments_pad32", rows, cols, 2, 8)
    padded = bytes_moved("colwise_segments_pad32", rows, cols, 2, 8)
    rowwise = bytes_moved("rowwise", rows, cols, 2, 8)
    assert both == padded + rowwise - rows * cols * 2
