import functools

import pytest

from cachelite.base import CacheConfigError, CacheInfo, UnhashableKeyError
from cachelite.lru import LRUCache
from cachelite.memo import make_key, memoize
from cachelite.ttl import TTLCache


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_bare_decorator_caches():
    calls = []

    @memoize
    def square(x):
        calls.append(x)
        return x * x

    assert square(3) == 9
    assert square(3) == 9
    assert square(4) == 16
    assert calls == [3, 4]
    assert square.cache_info() == CacheInfo(hits=1, misses=2, maxsize=128, currsize=2)


def test_decorator_with_arguments():
    @memoize(maxsize=2)
    def ident(x):
        return x

    for x in [1, 2, 3, 1]:
        ident(x)
    assert ident.cache_info() == CacheInfo(hits=0, misses=4, maxsize=2, currsize=2)
    assert isinstance(ident.cache, LRUCache)


def test_wraps_metadata():
    def original(a, b=2):
        """Docstring here."""
        return a + b

    wrapped = memoize(original)
    assert wrapped.__name__ == "original"
    assert wrapped.__doc__ == "Docstring here."
    assert wrapped.__wrapped__ is original


def test_keyword_order_does_not_matter():
    calls = []

    @memoize
    def f(a=0, b=0):
        calls.append((a, b))
        return a - b

    assert f(a=1, b=2) == -1
    assert f(b=2, a=1) == -1
    assert len(calls) == 1


def test_positional_and_keyword_are_distinct():
    calls = []

    @memoize
    def f(a):
        calls.append(a)
        return a

    f(1)
    f(a=1)
    assert len(calls) == 2


def test_tuple_argument_does_not_collide_with_several_arguments():
    @memoize
    def f(*args):
        return len(args)

    assert f(1, 2) == 2
    assert f((1, 2)) == 1


def test_untyped_treats_equal_values_as_same():
    calls = []

    @memoize
    def f(x):
        calls.append(x)
        return x

    f(1)
    f(1.0)
    assert len(calls) == 1


def test_typed_distinguishes_types():
    calls = []

    @memoize(typed=True)
    def f(x, y=0):
        calls.append(x)
        return x

    f(1)
    f(1.0)
    f(True)
    f(1)
    f(1, y=2)
    f(1, y=2.0)
    assert len(calls) == 5


def test_unhashable_argument_raises_and_does_not_call():
    calls = []

    @memoize
    def f(x):
        calls.append(x)
        return 1

    with pytest.raises(UnhashableKeyError):
        f([1, 2])
    with pytest.raises(TypeError):
        f(x={"a": 1})
    assert calls == []
    assert f.cache_info() == CacheInfo(0, 0, 128, 0)


def test_exceptions_are_not_cached():
    calls = []

    @memoize
    def flaky(x):
        calls.append(x)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return x

    with pytest.raises(RuntimeError):
        flaky(5)
    assert flaky(5) == 5
    assert flaky(5) == 5
    assert len(calls) == 2
    assert flaky.cache_info() == CacheInfo(hits=1, misses=2, maxsize=128, currsize=1)


def test_none_results_are_cached():
    calls = []

    @memoize
    def nothing(x):
        calls.append(x)
        return None

    assert nothing(1) is None
    assert nothing(1) is None
    assert calls == [1]


def test_cache_clear_resets_entries_and_stats():
    @memoize
    def f(x):
        return x

    f(1)
    f(1)
    f.cache_clear()
    assert f.cache_info() == CacheInfo(0, 0, 128, 0)
    f(1)
    assert f.cache_info().misses == 1


def test_each_function_has_its_own_cache():
    @memoize
    def f(x):
        return ("f", x)

    @memoize
    def g(x):
        return ("g", x)

    assert f(1) == ("f", 1)
    assert g(1) == ("g", 1)
    f.cache_clear()
    assert g.cache_info().currsize == 1
    assert f.cache is not g.cache


def test_recursive_function():
    @memoize(maxsize=None)
    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    assert fib(80) == 23416728348467685
    info = fib.cache_info()
    assert info.misses == 81
    assert info.hits == 78
    assert info.maxsize is None


def test_ttl_memoize_recomputes_after_expiry():
    clock = FakeClock()
    calls = []

    @memoize(ttl=10, timer=clock)
    def load(name):
        calls.append(name)
        return f"{name}-{len(calls)}"

    assert isinstance(load.cache, TTLCache)
    assert load("a") == "a-1"
    clock.now = 9.5
    assert load("a") == "a-1"
    clock.now = 10
    assert load("a") == "a-2"
    assert load.cache_info() == CacheInfo(hits=1, misses=2, maxsize=128, currsize=1)


def test_explicit_cache_instance():
    shared = LRUCache(maxsize=3)

    @memoize(cache=shared)
    def f(x):
        return x + 1

    f(1)
    assert f.cache is shared
    assert shared.info().currsize == 1
    assert f.cache_info() == shared.info()


@pytest.mark.parametrize("kwargs", [{"maxsize": -1}, {"ttl": 0}, {"ttl": -3}, {"maxsize": 2.5}])
def test_invalid_configuration_fails_at_decoration(kwargs):
    with pytest.raises(CacheConfigError):
        memoize(**kwargs)


def test_make_key_semantics():
    assert make_key((1, 2), {"a": 3, "b": 4}) == make_key((1, 2), {"b": 4, "a": 3})
    assert hash(make_key((1,), {})) == hash(make_key((1.0,), {}))
    assert make_key((1,), {}) == make_key((1.0,), {})
    assert make_key((1,), {}, typed=True) != make_key((1.0,), {}, typed=True)
    assert make_key((1,), {}) != make_key((), {"x": 1})
    assert make_key((1, 2), {}) != make_key(((1, 2),), {})
    with pytest.raises(UnhashableKeyError):
        make_key(([],), {})
    assert issubclass(UnhashableKeyError, TypeError)


def test_memoize_works_with_functools_partial_like_callables():
    @memoize
    def power(base, exp=2):
        return base**exp

    cube = functools.partial(power, exp=3)
    assert cube(2) == 8
    assert cube(2) == 8
    assert power.cache_info().hits == 1
