"""The application: the ``normandy`` command line, the demo replay, the console helpers and the
session workload generator. It sits on top and may import every other subpackage."""
