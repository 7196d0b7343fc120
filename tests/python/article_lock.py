"""The Python article's lock, as teams migrating from it run it, and a worker that increments a
shared counter under it with a read-sleep-write (tests/python_interop.rs runs this file).

    python3 article_lock.py <redis url> <lock name> <counter key> <increments> <sleep ms>
"""

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
    done = 0
    for _ in range(int(increments)):
        identifier = acquire_lock(conn, name, acquire_timeout=30, lock_timeout=10)
        if not identifier:
            sys.exit("could not take the lock within 30 s")
        value = int(conn.get(counter) or 0)
        time.sleep(int(sleep_ms) / 1000)
        conn.set(counter, value + 1)
        release_lock(conn, name, identifier)
        done += 1
    print("DONE", done, flush=True)


if __name__ == '__main__':
    main()
