"""Uniformly random permutations: ``randperm`` up to a few million items, above that a bucket
shuffle in chunks on the drawing pool."""

from __future__ import annotations

from functools import partial

import torch

from samplers._pool import CHUNK, run_tasks
from samplers._seeding import branch_seed, generator_for, sub_seed

__all__ = ["SEQUENTIAL_MAX", "bucket_shuffle", "permutation"]

#: Up to this many items a permutation is one ``randperm``. Its swaps miss the cache more the
#: larger it is (per item 10x slower at 10^7 items than at 6.5 * 10^4): around this size it
#: takes about as long as the bucket shuffle on one thread, above it longer.
SEQUENTIAL_MAX = 1 << 22
#: A bucket shuffle's buckets hold between half this and this many items on average, so that
#: each bucket's own shuffle runs in cache.
BUCKET = 1 << 16


def permutation(size: int, seed: int, stream: int = 0, count: int | None = None) -> torch.Tensor:
    """The first ``count`` items (default: all) of a uniformly random permutation of
    ``range(size)`` (int64), a pure function of ``(size, seed, stream)``.

    Up to :data:`SEQUENTIAL_MAX` items it is ``torch.randperm(size, generator=generator_for(seed,
    stream))``; above, :func:`bucket_shuffle` of ``sub_seed(seed, stream)``, which does not
    depend on the number of threads. ``count`` only truncates: the first items are the same for
    every ``count``.
    """
    if size > SEQUENTIAL_MAX:
        return bucket_shuffle(size, sub_seed(seed, stream), count)
    generator = generator_for(seed, stream)
    # randperm's Fisher-Yates swaps take their positions from the generator alone, whatever the
    # dtype: int32 gives the same permutation with half the memory traffic.
    return torch.randperm(size, generator=generator, dtype=torch.int32)[:count].long()


def bucket_shuffle(
    size: int, seed: int, count: int | None = None, *, chunk: int = CHUNK, bucket: int = BUCKET
) -> torch.Tensor:
    """The first ``count`` items of an exactly uniform random permutation of ``range(size)``
    (int64), the same for every number of threads (``chunk`` and ``bucket`` are smaller only in
    tests, to exercise many chunks and buckets at small sizes; they change the permutation).

    Every item goes to one of ``B`` buckets (a power of two, about ``size / bucket``), each with
    probability ``1 / B``, independently; the buckets are laid out one after the other and each
    is shuffled on its own. Given the bucket sizes, every split of the items into buckets of
    those sizes is equally likely and every order within each bucket too, so every permutation
    has probability ``1 / size!`` (up to the generator: ``B`` divides 2^32, so a bucket number
    needs no rejection). Each chunk of ``chunk`` items draws how many of its items go to each
    bucket (a bucket number per item, counted) and which ones (a shuffle of the chunk, cut into
    runs of those lengths), writing its runs to ranges that no other chunk writes; then each
    bucket is shuffled from its own generator. Each step works on one chunk or one bucket at a
    time, where one ``randperm`` over all items misses the cache at nearly every swap.
    """
    count = size if count is None else count
    buckets = 1 << max(0, (-(-size // bucket) - 1).bit_length())
    starts = range(0, size, chunk)
    dtype = torch.int32 if size < 2**31 else torch.long
    per_chunk = torch.empty(len(starts), buckets, dtype=torch.long)
    generators: dict[int, torch.Generator] = {}
    chunk_seed, bucket_seed = branch_seed(seed, 0), branch_seed(seed, 1)

    def count_chunk(c: int) -> None:
        generator = generator_for(chunk_seed, c)
        ids = torch.empty(min(chunk, size - starts[c]), dtype=torch.long)
        ids.random_(0, buckets, generator=generator)
        per_chunk[c] = torch.bincount(ids, minlength=buckets)
        generators[c] = generator  # the chunk's shuffle below continues its stream

    run_tasks([partial(count_chunk, c) for c in range(len(starts))])
    # Chunk c's run for bucket b goes where bucket b starts, after the earlier chunks' runs.
    sizes = per_chunk.sum(0)
    bucket_starts = sizes.cumsum(0).sub_(sizes)
    run_starts = per_chunk.cumsum(0).sub_(per_chunk).add_(bucket_starts)
    # A run moves by its destination minus its position in the shuffled chunk.
    moves = run_starts.sub_(per_chunk.cumsum(1).sub_(per_chunk))
    grouped = torch.empty(size, dtype=dtype)

    def scatter_chunk(c: int) -> None:
        n = min(chunk, size - starts[c])
        items = torch.randperm(n, generator=generators[c], dtype=dtype).add_(starts[c])
        where = torch.repeat_interleave(moves[c], per_chunk[c], output_size=n)
        grouped.index_copy_(0, where.add_(torch.arange(n)), items)

    run_tasks([partial(scatter_chunk, c) for c in range(len(starts))])
    out = torch.empty(count, dtype=torch.long)
    first, lengths = bucket_starts.tolist(), sizes.tolist()

    def shuffle_bucket(b: int) -> None:
        start, n = first[b], lengths[b]
        order = torch.randperm(n, generator=generator_for(bucket_seed, b), dtype=dtype)
        kept = order[: count - start]  # the last bucket that count reaches is cut
        out[start : start + kept.numel()] = torch.index_select(grouped[start : start + n], 0, kept)

    run_tasks([partial(shuffle_bucket, b) for b in range(buckets) if first[b] < count])
    return out
