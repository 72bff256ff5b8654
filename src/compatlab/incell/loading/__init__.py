"""What loading a module in the cell is made of, shared by both ways the import stage loads one (a fresh
interpreter each, ``loadcheck.load_module``; a child of the fork server, ``forkserver.ForkServer.load``).

- ``installed``: what to load of a distribution (its extension modules, then its top-level packages);
- ``elf``: the little ELF reading the import stage needs (dynamic symbols, DT_NEEDED, fat binary sections);
- ``demangle``: C++ symbol names, as the lab says them;
- ``observed``: what a load tried (the shared objects it mapped, every load it attempted, the libraries C code
  asked ``dlopen`` for and never got);
- ``cudamajor``: the CUDA major of a library's soname and of the environment;
- ``failure``: why a load failed, in one line and one code of the cause table (``incell/causes.py``).

Standard library and compatlab.incell only, Python 3.10 and later: it runs with the cell's interpreter.
"""
