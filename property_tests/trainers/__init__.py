"""Each trainer's kit module (one per trainer declared in `rebatch_startup.trainers` with ``kit``): how the
testing kit calls the trainer's own function from its cases (``PEER``, a `property_tests.peers.Peer`),
and, where the trainer has them, its side-by-side call (``side_by_side``), its device calls
(``DEVICE_CALLS``) and its steps in its own code (``step``). Each is imported by name, when asked for."""
