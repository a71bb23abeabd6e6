/* An LRU tier store in C: the key -> page map and the eviction order of one memory tier
 * (policies/tiers.py, `PrefixTier`), fused in one structure.
 *
 * Why C: a tier takes every page the device evicts (write-back) and moves its own victims to
 * the next tier, hundreds of thousands of pages in a trace-long run. In Python each page costs a
 * dict insert, a dict delete, a membership test and the LRU queue's list and flag updates, all
 * batched in C calls but each with its own pass, boxed ints and intermediate lists; here each is
 * a probe of one table and a few array writes. `DictStore` in tiers.py is the same store over a
 * dict and any eviction policy; the tests run both on the same operations and compare them.
 *
 * Layout. Pages 0 .. num_handed_out - 1 hold content (a tier page is never freed alone: content
 * leaves only by eviction, which reuses the page at once), so the free pages are the tail of the
 * range. Per page: its key (a reference), the key's hash, and its links in the LRU list (oldest
 * first), in which it is while cached (evictable) and out of which it is while pinned by a load.
 * The hash table holds page ids, open addressing with CPython's dict probe sequence (hash & mask,
 * then i = 5i + perturb + 1): consecutive int keys, whose hashes are themselves, land in
 * neighbouring slots. A deleted slot is a dummy, reused by a later insert on its probe path; the
 * table is rebuilt when its used and dummy slots pass 2/3 of it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define EMPTY (-1)
#define DUMMY (-2)
#define NONE (-1)
#define PERTURB_SHIFT 5
#define MIN_TABLE 8

typedef struct {
    PyObject_HEAD
    Py_ssize_t num_total;      /* pages the tier has */
    Py_ssize_t num_handed_out; /* pages 0 .. num_handed_out - 1 hold content */
    Py_ssize_t num_alloc;      /* pages the per-page arrays have room for */
    PyObject **key;            /* page -> its key (a reference) */
    Py_hash_t *hash;           /* page -> its key's hash */
    int32_t *prev, *next;      /* page -> its neighbours in the LRU list (NONE at the ends) */
    uint8_t *cached;           /* page -> 1 while in the LRU list */
    int32_t head, tail;        /* the least and the most recently used cached page */
    Py_ssize_t num_cached;
    int32_t *table;            /* slot -> EMPTY, DUMMY or a page */
    size_t mask;               /* table size - 1 */
    Py_ssize_t num_fill;       /* slots used or dummy */
} TierStore;

/* ------------------------------------------------------------------------------- the table */

/* The slot of `key` (hash `h`): its page in *page (NONE when absent) and, when absent, the slot
 * an insert takes (the first dummy on its path, else the empty slot ending it). -1 on a
 * comparison error. */
static int
find(TierStore *s, PyObject *key, Py_hash_t h, size_t *slot, int32_t *page)
{
    size_t mask = s->mask, i = (size_t)h & mask, perturb = (size_t)h;
    Py_ssize_t free_slot = -1;
    for (;;) {
        int32_t ix = s->table[i];
        if (ix == EMPTY) {
            *slot = free_slot >= 0 ? (size_t)free_slot : i;
            *page = NONE;
            return 0;
        }
        if (ix == DUMMY) {
            if (free_slot < 0)
                free_slot = (Py_ssize_t)i;
        }
        else if (s->hash[ix] == h) {
            PyObject *held = s->key[ix];
            if (held == key) {
                *slot = i;
                *page = ix;
                return 0;
            }
            int equal = PyObject_RichCompareBool(held, key, Py_EQ);
            if (equal < 0)
                return -1;
            if (equal) {
                *slot = i;
                *page = ix;
                return 0;
            }
        }
        perturb >>= PERTURB_SHIFT;
        i = (i * 5 + perturb + 1) & mask;
    }
}

/* The slot holding `page` (which is in the table). */
static size_t
slot_of_page(TierStore *s, int32_t page)
{
    size_t mask = s->mask, i = (size_t)s->hash[page] & mask, perturb = (size_t)s->hash[page];
    while (s->table[i] != page) {
        perturb >>= PERTURB_SHIFT;
        i = (i * 5 + perturb + 1) & mask;
    }
    return i;
}

/* An empty slot for hash `h` (a table being rebuilt has no dummies and no equal keys). */
static size_t
empty_slot(int32_t *table, size_t mask, Py_hash_t h)
{
    size_t i = (size_t)h & mask, perturb = (size_t)h;
    while (table[i] != EMPTY) {
        perturb >>= PERTURB_SHIFT;
        i = (i * 5 + perturb + 1) & mask;
    }
    return i;
}

/* Rebuild the table, dummies dropped, with room for `extra` more keys within 2/3 of it. */
static int
rebuild(TierStore *s, Py_ssize_t extra)
{
    Py_ssize_t used = s->num_handed_out;
    size_t size = MIN_TABLE;
    while ((Py_ssize_t)size * 2 < (used + extra) * 3 + 3)
        size <<= 1;
    int32_t *table = PyMem_Malloc(size * sizeof(int32_t));
    if (table == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(table, 0xff, size * sizeof(int32_t)); /* every slot EMPTY (-1) */
    for (Py_ssize_t page = 0; page < used; page++)
        table[empty_slot(table, size - 1, s->hash[page])] = (int32_t)page;
    PyMem_Free(s->table);
    s->table = table;
    s->mask = size - 1;
    s->num_fill = used;
    return 0;
}

/* Room for `extra` more keys: the table within 2/3 full after them. */
static int
reserve_slots(TierStore *s, Py_ssize_t extra)
{
    if ((s->num_fill + extra) * 3 < (Py_ssize_t)(s->mask + 1) * 2)
        return 0;
    return rebuild(s, extra);
}

/* Room in the per-page arrays for pages up to `num_pages` (grown by doubling, to num_total). */
static int
reserve_pages(TierStore *s, Py_ssize_t num_pages)
{
    if (num_pages <= s->num_alloc)
        return 0;
    Py_ssize_t alloc = s->num_alloc ? s->num_alloc : 64;
    while (alloc < num_pages)
        alloc *= 2;
    if (alloc > s->num_total)
        alloc = s->num_total;
    PyObject **key = PyMem_Realloc(s->key, alloc * sizeof(PyObject *));
    if (key != NULL)
        s->key = key;
    Py_hash_t *hash = PyMem_Realloc(s->hash, alloc * sizeof(Py_hash_t));
    if (hash != NULL)
        s->hash = hash;
    int32_t *prev = PyMem_Realloc(s->prev, alloc * sizeof(int32_t));
    if (prev != NULL)
        s->prev = prev;
    int32_t *next = PyMem_Realloc(s->next, alloc * sizeof(int32_t));
    if (next != NULL)
        s->next = next;
    uint8_t *cached = PyMem_Realloc(s->cached, alloc);
    if (cached != NULL)
        s->cached = cached;
    if (key == NULL || hash == NULL || prev == NULL || next == NULL || cached == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(s->cached + s->num_alloc, 0, alloc - s->num_alloc);
    s->num_alloc = alloc;
    return 0;
}

/* ---------------------------------------------------------------------------- the LRU list */

static void
lru_append(TierStore *s, int32_t page)
{
    s->prev[page] = s->tail;
    s->next[page] = NONE;
    if (s->tail != NONE)
        s->next[s->tail] = page;
    else
        s->head = page;
    s->tail = page;
    s->cached[page] = 1;
    s->num_cached++;
}

static void
lru_unlink(TierStore *s, int32_t page)
{
    int32_t prev = s->prev[page], next = s->next[page];
    if (prev != NONE)
        s->next[prev] = next;
    else
        s->head = next;
    if (next != NONE)
        s->prev[next] = prev;
    else
        s->tail = prev;
    s->cached[page] = 0;
    s->num_cached--;
}

/* ------------------------------------------------------------------------------- helpers */

/* `page` takes `key` (absent, its hash `h`, its insert slot `slot`) and becomes the most
 * recently used. */
static void
assign(TierStore *s, int32_t page, PyObject *key, Py_hash_t h, size_t slot)
{
    if (s->table[slot] == EMPTY)
        s->num_fill++;
    s->table[slot] = page;
    Py_INCREF(key);
    s->key[page] = key;
    s->hash[page] = h;
    lru_append(s, page);
}

/* The pages as a list of ints: `pages[0 .. count)`, or, where `pages` is NULL, `count` pages in
 * a row from `first`. */
static PyObject *
page_list(const int32_t *pages, Py_ssize_t first, Py_ssize_t count)
{
    PyObject *list = PyList_New(count);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *page = PyLong_FromSsize_t(pages != NULL ? pages[i] : first + i);
        if (page == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, i, page);
    }
    return list;
}

/* A list argument (keys or pages) as a fast sequence; NULL with TypeError otherwise. */
static PyObject *
as_list(PyObject *arg, const char *what)
{
    if (!PyList_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a list, got %.100s", what,
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_INCREF(arg);
    return arg;
}

/* `pages` (a list of ints) as page ids, each checked to hold content. */
static int32_t *
page_ids(TierStore *s, PyObject *pages, Py_ssize_t *count)
{
    Py_ssize_t n = PyList_GET_SIZE(pages);
    int32_t *ids = PyMem_Malloc((n ? n : 1) * sizeof(int32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t page = PyLong_AsSsize_t(PyList_GET_ITEM(pages, i));
        if (page == -1 && PyErr_Occurred()) {
            PyMem_Free(ids);
            return NULL;
        }
        if (page < 0 || page >= s->num_handed_out) {
            PyMem_Free(ids);
            PyErr_Format(PyExc_ValueError, "tier page %zd holds no content", page);
            return NULL;
        }
        ids[i] = (int32_t)page;
    }
    *count = n;
    return ids;
}

/* ------------------------------------------------------------------------------- methods */

/* TierStore(num_pages): set up whole at creation (no __init__ to call twice or skip). */
static PyObject *
TierStore_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"num_pages", NULL};
    Py_ssize_t num_pages;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", names, &num_pages))
        return NULL;
    if (num_pages < 1 || num_pages > INT32_MAX - 1) {
        PyErr_Format(PyExc_ValueError, "num_pages %zd: expected 1 to %d", num_pages,
                     INT32_MAX - 1);
        return NULL;
    }
    TierStore *s = (TierStore *)type->tp_alloc(type, 0); /* (zeroed) */
    if (s == NULL)
        return NULL;
    s->num_total = num_pages;
    s->head = s->tail = NONE;
    if (rebuild(s, 0) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    return (PyObject *)s;
}

static void
release_keys(TierStore *s)
{
    for (Py_ssize_t page = 0; page < s->num_handed_out; page++)
        Py_CLEAR(s->key[page]);
}

static void
TierStore_dealloc(TierStore *s)
{
    release_keys(s);
    PyMem_Free(s->key);
    PyMem_Free(s->hash);
    PyMem_Free(s->prev);
    PyMem_Free(s->next);
    PyMem_Free(s->cached);
    PyMem_Free(s->table);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *
TierStore_put_into_free(TierStore *s, PyObject *arg)
{
    PyObject *keys = as_list(arg, "put_into_free");
    if (keys == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), first = s->num_handed_out;
    PyObject *stored = NULL, *pages = NULL, *result = NULL;
    if (n > s->num_total - first) {
        PyErr_Format(PyExc_ValueError, "%zd keys but %zd free tier pages", n,
                     s->num_total - first);
        goto done;
    }
    if (reserve_pages(s, first + n) < 0 || reserve_slots(s, n) < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_hash_t h = PyObject_Hash(key);
        size_t slot;
        int32_t page;
        if (h == -1 || find(s, key, h, &slot, &page) < 0)
            goto done;
        if (page != NONE) { /* held already: not stored */
            if (stored == NULL) {
                stored = PyList_New(n);
                if (stored == NULL)
                    goto done;
                for (Py_ssize_t j = 0; j < n; j++)
                    PyList_SET_ITEM(stored, j, Py_NewRef(j < i ? Py_True : Py_False));
            }
            continue;
        }
        if (stored != NULL && PyList_SetItem(stored, i, Py_NewRef(Py_True)) < 0)
            goto done;
        assign(s, (int32_t)s->num_handed_out++, key, h, slot);
    }
    pages = page_list(NULL, first, s->num_handed_out - first);
    if (pages != NULL)
        result = PyTuple_Pack(2, stored != NULL ? stored : Py_None, pages);
done:
    Py_DECREF(keys);
    Py_XDECREF(stored);
    Py_XDECREF(pages);
    return result;
}

static PyObject *
TierStore_put_many(TierStore *s, PyObject *arg)
{
    PyObject *keys = as_list(arg, "put_many");
    if (keys == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys), first = s->num_handed_out;
    Py_ssize_t num_free = n < s->num_total - first ? n : s->num_total - first;
    Py_ssize_t num_victims = n - num_free < s->num_cached ? n - num_free : s->num_cached;
    Py_ssize_t start = n - num_free - num_victims, count = num_free + num_victims;
    PyObject *stored = NULL, *pages = NULL, *victim_pages = NULL, *victim_keys = NULL;
    PyObject *result = NULL;
    int32_t *ids = PyMem_Malloc((count ? count : 1) * sizeof(int32_t));
    if (ids == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    stored = PyList_GetSlice(keys, start, n);
    victim_keys = PyList_New(num_victims);
    if (stored == NULL || victim_keys == NULL || reserve_pages(s, first + num_free) < 0
            || reserve_slots(s, count) < 0)
        goto done;
    /* hash first: an unhashable key fails the call before anything changed */
    Py_hash_t *hashes = PyMem_Malloc((count ? count : 1) * sizeof(Py_hash_t));
    if (hashes == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        hashes[i] = PyObject_Hash(PyList_GET_ITEM(stored, i));
        if (hashes[i] == -1) {
            PyMem_Free(hashes);
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < num_free; i++)
        ids[i] = (int32_t)(first + i);
    for (Py_ssize_t i = 0; i < num_victims; i++) { /* the oldest cached pages lose content */
        int32_t page = s->head;
        lru_unlink(s, page);
        s->table[slot_of_page(s, page)] = DUMMY;
        PyList_SET_ITEM(victim_keys, i, s->key[page]); /* (the reference moves) */
        s->key[page] = NULL;
        ids[num_free + i] = page;
    }
    s->num_handed_out += num_free;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(stored, i);
        size_t slot;
        int32_t held;
        if (find(s, key, hashes[i], &slot, &held) < 0) {
            PyMem_Free(hashes);
            goto done;
        }
        if (held != NONE) {
            PyMem_Free(hashes);
            PyErr_SetString(PyExc_ValueError, "put_many: a key is held already");
            goto done;
        }
        assign(s, ids[i], key, hashes[i], slot);
    }
    PyMem_Free(hashes);
    pages = page_list(ids, 0, count);
    victim_pages = page_list(ids + num_free, 0, num_victims);
    if (pages != NULL && victim_pages != NULL)
        result = PyTuple_Pack(4, stored, pages, victim_pages, victim_keys);
done:
    PyMem_Free(ids);
    Py_DECREF(keys);
    Py_XDECREF(stored);
    Py_XDECREF(pages);
    Py_XDECREF(victim_pages);
    Py_XDECREF(victim_keys);
    return result;
}

static PyObject *
TierStore_get(TierStore *s, PyObject *key)
{
    Py_hash_t h = PyObject_Hash(key);
    size_t slot;
    int32_t page;
    if (h == -1 || find(s, key, h, &slot, &page) < 0)
        return NULL;
    if (page == NONE)
        Py_RETURN_NONE;
    return PyLong_FromLong(page);
}

static int
TierStore_contains(TierStore *s, PyObject *key)
{
    Py_hash_t h = PyObject_Hash(key);
    size_t slot;
    int32_t page;
    if (h == -1 || find(s, key, h, &slot, &page) < 0)
        return -1;
    return page != NONE;
}

/* What a lookup of a list of keys returns. */
typedef enum {
    PAGE_OF_EACH, /* each key's page, or None */
    HELD_EACH,    /* whether each key is held */
    HELD_ANY,     /* whether any key is held (stops at the first) */
} LookUp;

static PyObject *
look_up(TierStore *s, PyObject *arg, LookUp mode)
{
    PyObject *keys = as_list(arg, "keys");
    if (keys == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *result = mode == HELD_ANY ? NULL : PyList_New(n);
    if (mode != HELD_ANY && result == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        Py_hash_t h = PyObject_Hash(key);
        size_t slot;
        int32_t page;
        if (h == -1 || find(s, key, h, &slot, &page) < 0)
            goto fail;
        if (mode == HELD_ANY) {
            if (page != NONE) {
                Py_DECREF(keys);
                Py_RETURN_TRUE;
            }
            continue;
        }
        PyObject *value;
        if (mode == HELD_EACH)
            value = Py_NewRef(page != NONE ? Py_True : Py_False);
        else if (page == NONE)
            value = Py_NewRef(Py_None);
        else if ((value = PyLong_FromLong(page)) == NULL)
            goto fail;
        PyList_SET_ITEM(result, i, value);
    }
    Py_DECREF(keys);
    if (mode == HELD_ANY)
        Py_RETURN_FALSE;
    return result;
fail:
    Py_DECREF(keys);
    Py_XDECREF(result);
    return NULL;
}

static PyObject *
TierStore_pages_of(TierStore *s, PyObject *keys)
{
    return look_up(s, keys, PAGE_OF_EACH);
}

static PyObject *
TierStore_holds_each(TierStore *s, PyObject *keys)
{
    return look_up(s, keys, HELD_EACH);
}

static PyObject *
TierStore_holds_any(TierStore *s, PyObject *keys)
{
    return look_up(s, keys, HELD_ANY);
}

static PyObject *
TierStore_pin(TierStore *s, PyObject *arg)
{
    PyObject *pages = as_list(arg, "pin");
    if (pages == NULL)
        return NULL;
    Py_ssize_t n;
    int32_t *ids = page_ids(s, pages, &n);
    Py_DECREF(pages);
    if (ids == NULL)
        return NULL;
    PyObject *taken = PyList_New(n);
    if (taken != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            int held = s->cached[ids[i]];
            if (held)
                lru_unlink(s, ids[i]);
            PyList_SET_ITEM(taken, i, Py_NewRef(held ? Py_True : Py_False));
        }
    }
    PyMem_Free(ids);
    return taken;
}

static PyObject *
TierStore_unpin(TierStore *s, PyObject *args)
{
    PyObject *arg, *keys = NULL; /* (the keys: held per page already) */
    if (!PyArg_UnpackTuple(args, "unpin", 1, 2, &arg, &keys))
        return NULL;
    PyObject *pages = as_list(arg, "unpin");
    if (pages == NULL)
        return NULL;
    Py_ssize_t n;
    int32_t *ids = page_ids(s, pages, &n);
    Py_DECREF(pages);
    if (ids == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (s->cached[ids[i]]) {
            PyMem_Free(ids);
            PyErr_Format(PyExc_ValueError, "unpin: tier page %d is not pinned", ids[i]);
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++)
        lru_append(s, ids[i]);
    PyMem_Free(ids);
    Py_RETURN_NONE;
}

static PyObject *
TierStore_clear(TierStore *s, PyObject *Py_UNUSED(ignored))
{
    release_keys(s);
    s->num_handed_out = 0;
    s->num_cached = 0;
    s->head = s->tail = NONE;
    if (s->num_alloc)
        memset(s->cached, 0, s->num_alloc);
    if (rebuild(s, 0) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
TierStore_lru_pages(TierStore *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(0);
    if (list == NULL)
        return NULL;
    for (int32_t page = s->head; page != NONE; page = s->next[page]) {
        PyObject *item = PyLong_FromLong(page);
        if (item == NULL || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    return list;
}

static PyObject *
TierStore_keys(TierStore *s, PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(s->num_handed_out);
    if (list == NULL)
        return NULL;
    for (Py_ssize_t page = 0; page < s->num_handed_out; page++)
        PyList_SET_ITEM(list, page, Py_NewRef(s->key[page]));
    return list;
}

static PyObject *
check_failed(const char *message)
{
    PyErr_SetString(PyExc_AssertionError, message);
    return NULL;
}

static PyObject *
TierStore_check(TierStore *s, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"distinct", NULL};
    int distinct = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|$p", names, &distinct))
        return NULL;
    if (!distinct) /* (the per-step check: the table is walked only when asked) */
        Py_RETURN_NONE;
    Py_ssize_t in_table = 0, listed = 0, cached = 0;
    for (size_t i = 0; i <= s->mask; i++)
        in_table += s->table[i] >= 0;
    if (in_table != s->num_handed_out)
        return check_failed("a tier page was lost (or holds two keys)");
    for (Py_ssize_t page = 0; page < s->num_handed_out; page++) {
        size_t slot;
        int32_t found;
        if (s->key[page] == NULL)
            return check_failed("a tier page holds no key");
        if (find(s, s->key[page], s->hash[page], &slot, &found) < 0)
            return NULL;
        if (found != page)
            return check_failed("a tier page's key leads to another page");
        cached += s->cached[page];
    }
    for (int32_t page = s->head, prev = NONE; page != NONE; prev = page, page = s->next[page]) {
        if (page < 0 || page >= s->num_handed_out || !s->cached[page] || s->prev[page] != prev)
            return check_failed("the LRU list is broken");
        if (++listed > s->num_handed_out)
            return check_failed("the LRU list has a cycle");
    }
    if (listed != cached || listed != s->num_cached)
        return check_failed("a tier page left its LRU list");
    Py_RETURN_NONE;
}

static PyObject *
TierStore_get_num_handed_out(TierStore *s, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(s->num_handed_out);
}

static PyObject *
TierStore_get_num_cached(TierStore *s, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(s->num_cached);
}

static PyObject *
TierStore_get_num_total(TierStore *s, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(s->num_total);
}

static PyMethodDef TierStore_methods[] = {
    {"put_into_free", (PyCFunction)TierStore_put_into_free, METH_O,
     "put_into_free(keys) -> (stored flags or None, pages): each key not held takes the next free "
     "page and becomes the most recently used."},
    {"put_many", (PyCFunction)TierStore_put_many, METH_O,
     "put_many(keys) -> (keys stored, pages, victim pages, victim keys): keys none held; free "
     "pages first, then the least recently used; the last keys are stored when room is short."},
    {"get", (PyCFunction)TierStore_get, METH_O, "get(key) -> the page holding key, or None."},
    {"pages_of", (PyCFunction)TierStore_pages_of, METH_O,
     "pages_of(keys) -> each key's page or None."},
    {"holds_each", (PyCFunction)TierStore_holds_each, METH_O,
     "holds_each(keys) -> whether each key is held."},
    {"holds_any", (PyCFunction)TierStore_holds_any, METH_O,
     "holds_any(keys) -> whether any key is held."},
    {"pin", (PyCFunction)TierStore_pin, METH_O,
     "pin(pages) -> whether each was cached: those leave the LRU list (not evictable)."},
    {"unpin", (PyCFunction)TierStore_unpin, METH_VARARGS,
     "unpin(pages[, keys]): pinned pages become the most recently used, in order (keys: theirs, "
     "which the store knows)."},
    {"clear", (PyCFunction)TierStore_clear, METH_NOARGS, "clear(): drop every page's content."},
    {"keys", (PyCFunction)TierStore_keys, METH_NOARGS,
     "keys() -> the keys held, by page."},
    {"lru_pages", (PyCFunction)TierStore_lru_pages, METH_NOARGS,
     "lru_pages() -> the cached pages, least recently used first."},
    {"check", (PyCFunction)(void (*)(void))TierStore_check, METH_VARARGS | METH_KEYWORDS,
     "check(*, distinct=True): AssertionError unless every page holding content is in the table "
     "once, under its own key, and the LRU list holds exactly the cached pages (distinct=False: "
     "nothing to check that the counters do not show)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef TierStore_getset[] = {
    {"num_handed_out", (getter)TierStore_get_num_handed_out, NULL, "pages holding content", NULL},
    {"num_cached", (getter)TierStore_get_num_cached, NULL, "pages evictable (not pinned)", NULL},
    {"num_total", (getter)TierStore_get_num_total, NULL, "pages the tier has", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods TierStore_as_sequence = {
    .sq_contains = (objobjproc)TierStore_contains,
};

static PyTypeObject TierStoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "kvlab.policies._tierstore.TierStore",
    .tp_doc = "A memory tier's key -> page map and LRU order (see policies/tiers.py).",
    .tp_basicsize = sizeof(TierStore),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = TierStore_new,
    .tp_dealloc = (destructor)TierStore_dealloc,
    .tp_methods = TierStore_methods,
    .tp_getset = TierStore_getset,
    .tp_as_sequence = &TierStore_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "kvlab.policies._tierstore",
    .m_doc = "An LRU tier store in C (policies/tiers.py uses it for lru tiers when built).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__tierstore(void)
{
    if (PyType_Ready(&TierStoreType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TierStoreType);
    if (PyModule_AddObject(m, "TierStore", (PyObject *)&TierStoreType) < 0) {
        Py_DECREF(&TierStoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
