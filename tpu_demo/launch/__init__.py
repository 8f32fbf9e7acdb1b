"""The composition root: flags -> device -> engine -> web page -> server, single process or torchrun rank."""
