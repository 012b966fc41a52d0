"""ListPrefix: the view of a growing list that a history's snapshots share. It must read as
the list it stands for, for every reader, and no view may ever see an item change."""
from __future__ import annotations

import copy
import json
import pickle

import pytest

from engine.report.list_prefix import ListPrefix, as_json


def grown(*tails: list[int]) -> list[ListPrefix[int]]:
    """Views made as a history makes them: each continuing the one before from its end."""
    views = [ListPrefix.continued([], 0, tails[0])]
    for tail in tails[1:]:
        views.append(ListPrefix.continued(views[-1], len(views[-1]), tail))
    return views


def test_each_view_reads_its_own_length_of_one_shared_list():
    a, b, c = grown([1, 2], [3], [4, 5])
    assert (list(a), list(b), list(c)) == ([1, 2], [1, 2, 3], [1, 2, 3, 4, 5])
    assert b.shares_with(a) and c.shares_with(b) and c.shared is a.shared
    assert len(a.shared) == 5  # three views, every item held once


def test_a_continuation_from_an_older_view_copies_and_changes_no_view():
    a, b = grown([1, 2], [3])
    branch = ListPrefix.continued(a, 2, [9, 9])        # a is not the list's latest view any more
    back = ListPrefix.continued(b, 1, [7])              # a list that went back (a preempted table)
    assert not branch.shares_with(a) and not back.shares_with(b)
    assert (list(a), list(b), list(branch), list(back)) == ([1, 2], [1, 2, 3], [1, 2, 9, 9], [1, 7])
    source = [1, 2]
    ListPrefix.continued(source, 2, [3])
    assert source == [1, 2]                             # a plain list is never extended in place


@pytest.mark.parametrize("index", [0, 2, -1, -3, slice(None), slice(1, None), slice(None, -1), slice(None, None, -1),
                                   slice(-2, None, -1), slice(5, 1, -2), slice(10, 20), slice(0, 3, 2)])
def test_indexing_and_slices_read_as_the_list_does_never_past_the_views_end(index):
    first, _ = grown([10, 11, 12], [13, 14])           # the shared list holds 5: the first view reads 3
    assert first[index] == [10, 11, 12][index]


@pytest.mark.parametrize("index", [3, -4])
def test_an_index_past_the_views_end_raises_though_the_list_holds_it(index):
    first, _ = grown([10, 11, 12], [13])
    with pytest.raises(IndexError, match="outside a list of 3"):
        first[index]


def test_equality_iteration_and_the_rest_of_a_lists_manners():
    a, b = grown([1, 2], [3])
    assert a == [1, 2] and [1, 2] == a and a != [1, 2, 3] and b == [1, 2, 3]
    assert a != (1, 2) and a == ListPrefix.continued([], 0, [1, 2])
    assert {"ids": a} == {"ids": [1, 2]}               # inside a snapshot compared with a whole one
    assert list(iter(a)) == [1, 2] and 3 not in a and 2 in a and list(reversed(b)) == [3, 2, 1]
    assert a + [5] == [1, 2, 5] and [0] + a == [0, 1, 2]  # noqa: RUF005 (the operators under test)
    assert repr(a) == "[1, 2]" and a.tolist() == [1, 2]
    with pytest.raises(TypeError):
        hash(a)


def test_copies_pickles_and_json_hold_the_views_items_alone():
    a, _ = grown([1, 2], [3])
    for other in (copy.deepcopy(a), copy.copy(a), pickle.loads(pickle.dumps(a))):
        assert other == [1, 2] and len(other.shared) == 2 and not other.shares_with(a)
    assert json.dumps({"ids": a}, default=as_json) == '{"ids": [1, 2]}'
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        json.dumps({"x": object()}, default=as_json)
