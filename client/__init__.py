"""The admin API's wire types (protocol.py) and its client (admin_client.py): what `teamtr improve` and
other tools use to talk to a running server, without importing the server."""
