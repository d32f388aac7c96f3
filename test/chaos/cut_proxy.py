#!/usr/bin/env python3
# A loopback TCP proxy the chaos harness can cut: while the file CUT exists, new connections are
# refused and open ones are closed, so the agent behind it is cut off from the server.
# Usage: cut_proxy.py LISTEN_PORT_FILE TARGET_PORT CUT_FILE
import os
import selectors
import socket
import sys
import threading

port_file, target_port, cut_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def pump(a, b):
    selector = selectors.DefaultSelector()
    selector.register(a, selectors.EVENT_READ, b)
    selector.register(b, selectors.EVENT_READ, a)
    try:
        while not os.path.exists(cut_file):
            for key, _ in selector.select(timeout=0.2):
                data = key.fileobj.recv(65536)
                if not data:
                    return
                key.data.sendall(data)
    except OSError:
        pass
    finally:
        a.close()
        b.close()


listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(64)
with open(port_file + ".tmp", "w") as f:
    f.write(str(listener.getsockname()[1]))
os.rename(port_file + ".tmp", port_file)
while True:
    client, _ = listener.accept()
    if os.path.exists(cut_file):
        client.close()
        continue
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port), timeout=2)
    except OSError:
        client.close()
        continue
    threading.Thread(target=pump, args=(client, upstream), daemon=True).start()
