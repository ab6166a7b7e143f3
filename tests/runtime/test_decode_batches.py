"""Decode batching: chunks by length under a token budget, results in input order as soon as they can be."""

from xspec.runtime.decode_batches import in_input_order, length_sorted_chunks


def test_chunks_are_sorted_by_length_and_stay_under_the_budget():
    lengths = [5, 1, 3, 3, 9, 2]
    chunks = list(length_sorted_chunks(range(6), lengths, batch_tokens=8))
    assert chunks == [[1, 5], [2, 3], [0], [4]]       # 2x2, 2x3, then 5 and 9 alone (9 > 8 still goes)
    assert sorted(i for c in chunks for i in c) == list(range(6))


def test_equal_length_chunks_never_mix_lengths():
    lengths = [2, 2, 3, 2, 3]
    chunks = list(length_sorted_chunks(range(5), lengths, batch_tokens=100, equal_length=True))
    assert chunks == [[0, 1, 3], [2, 4]]


def test_results_come_out_in_input_order_as_soon_as_a_prefix_is_complete():
    decoded = []

    def decode(chunk):
        decoded.append(chunk)
        return [f"r{i}" for i in chunk]

    results = [None, [], None, None]                    # line 1 is already done (an empty line)
    out = list(in_input_order(results, iter([[2], [0], [3]]), decode))
    # nothing before line 0 is done; decoding 0 releases 0, 1 and 2; then 3.
    assert out == [["r0", [], "r2"], ["r3"]]
    assert decoded == [[2], [0], [3]]


def test_lines_all_done_beforehand_come_out_without_decoding():
    assert list(in_input_order([[], []], iter([]), lambda chunk: [])) == [[[], []]]
    assert list(in_input_order([], iter([]), lambda chunk: [])) == []
