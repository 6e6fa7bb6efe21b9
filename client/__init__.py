"""The API's wire types (protocol.py: the chat API; admin_protocol.py: the admin API) and the admin API's
client (admin_client.py): what `teamtr improve` and other tools use to talk to a running server, without
importing the server."""
