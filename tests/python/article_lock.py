"""The Python article's lock, as teams migrating from it run it, and a worker that increments a
shared counter under it with a read-sleep-write (tests/python_interop.rs runs this file).

    python3 article_lock.py <redis url> <lock name> <counter key> <increments> <sleep ms>

The worker connects, prints READY, and starts only when a line arrives on its standard input, so
that the test can start the Python and Rust workers at the same moment. Each section also appends
"py" to the list `<counter key>:log`, which shows how the sections of both sides interleaved, and
pauses for up to three times the sleep outside the lock. It prints DONE <increments> at the end.
"""

import random
import sys
import time
import uuid

import redis


def acquire_lock(conn, lockname, acquire_timeout=10, lock_timeout=10):
    identifier = str(uuid.uuid4())
    lockname = 'lock:' + lockname
    end = time.time() + acquire_timeout
    while time.time() < end:
        if conn.set(lockname, identifier, nx=True, ex=lock_timeout):
            return identifier
        time.sleep(.001)
    return False


RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
else
    return 0
end
"""


def release_lock(conn, lockname, identifier):
    lockname = 'lock:' + lockname
    return conn.eval(RELEASE, 1, lockname, identifier)


def main():
    url, name, counter, increments, sleep_ms = sys.argv[1:6]
    conn = redis.Redis.from_url(url)
    conn.ping()
    print("READY", flush=True)
    if not sys.stdin.readline():
        sys.exit("standard input closed before the start signal")
    done = 0
    for _ in range(int(increments)):
        identifier = acquire_lock(conn, name, acquire_timeout=30, lock_timeout=10)
        if not identifier:
            sys.exit("could not take the lock within 30 s")
        value = int(conn.get(counter) or 0)
        time.sleep(int(sleep_ms) / 1000)
        conn.set(counter, value + 1)
        conn.rpush(counter + ':log', 'py')
        release_lock(conn, name, identifier)
        done += 1
        # Other work between sections: without it the two Python workers, polling every 1 ms,
        # would pass the lock between themselves until both are done.
        time.sleep(random.uniform(0, 3 * int(sleep_ms)) / 1000)
    print("DONE", done, flush=True)


if __name__ == '__main__':
    main()
