"""moe_ep._overlap.InFlight, the vLLM adapter's book of layer calls
between prepare and finalize: lookups oldest first, a refused finalize
keeping its place, and what a third prepare gives up."""
import torch

from moe_ep._overlap import InFlight


class Op:
    def __init__(self, name):
        self.name, self.stamp = name, None

    def __repr__(self):
        return self.name


def test_one_tensor_two_operations_taken_oldest_first():
    book, ids = InFlight(), torch.zeros((4, 2), dtype=torch.int64)
    a, b = Op("a"), Op("b")
    book.add(a, ids)
    book.add(b, ids)
    got = [book.take(ids, "finalize"), book.take(ids, "finalize")]
    assert got == [a, b], "took %s, want [a, b]" % got


def test_same_storage_found_oldest_first():
    book, ids = InFlight(), torch.arange(8).reshape(4, 2)
    a, b = Op("a"), Op("b")
    book.add(a, ids)
    book.add(b, ids)
    got = book.take(ids.view(4, 2), "finalize")  # another tensor object, same storage and shape
    assert got is a, "took %s, want a" % got


def test_refused_finalize_keeps_its_place():
    book = InFlight()
    ids = [torch.zeros(2), torch.zeros(2)]
    a, b = Op("a"), Op("b")
    book.add(a, ids[0])
    book.add(b, ids[1])
    book.add(book.take(ids[0], "finalize"), ids[0])  # refused, put back
    got = book.stale()
    assert got == [a], "a third prepare gave up %s, want [a] (a is still the older)" % got
    assert len(book) == 1 and book.take(ids[1], "finalize") is b


def test_stale_keeps_one_for_the_new_prepare():
    book = InFlight()
    ops = [Op(str(i)) for i in range(4)]
    for op in ops:
        book.add(op, torch.zeros(1))
    got = book.stale()
    assert got == ops[:3], "gave up %s, want the three oldest" % got
    assert book.stale() == [] and len(book) == 1


def test_given_up_operation_is_not_found():
    book, ids = InFlight(), torch.zeros(3)
    book.add(Op("a"), ids)
    book.add(Op("b"), torch.zeros(3))
    book.stale()
    try:
        book.take(ids, "finalize")
    except ValueError as e:
        assert "finalize: topk_ids (shape (3,)) is not a tensor that a pending prepare" in str(e), e
        assert "gives up the oldest of two" in str(e), e
    else:
        raise AssertionError("take found an operation that stale() gave up")


def test_refused_finalize_of_one_tensor_keeps_its_place():
    book, ids = InFlight(), torch.zeros((4, 2), dtype=torch.int64)
    a, b = Op("a"), Op("b")
    book.add(a, ids)
    book.add(b, ids)
    book.add(book.take(ids, "finalize"), ids)  # a's finalize refused, put back behind b
    got = book.take(ids, "finalize")
    assert got is a, "took %s, want a (the older)" % got


def test_given_up_operation_is_not_put_back():
    book, ids = InFlight(), torch.zeros(3)
    a = Op("a")
    book.add(a, ids)
    book.add(Op("b"), torch.zeros(3))
    assert book.stale() == [a]
    book.add(a, ids)  # a late receiver or a refused finalize registering it again
    assert len(book) == 1, "a given-up operation came back: %d in flight" % len(book)
