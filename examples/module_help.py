"""``--help`` for the examples' helper modules: they are imported by the scripts, not run.

A helper module ends its ``__main__`` block with ``module_help.answer(__doc__, name, users)``:
``--help`` prints its docstring and who imports it; anything else says to run those instead.
"""

import argparse


def answer(doc, name, users):
    """Answer ``--help`` for the helper module ``name`` (whose docstring is ``doc``), or exit
    saying that ``users`` import it."""
    argparse.ArgumentParser(description=doc, epilog=f'This module is imported by {users}, not run.',
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    raise SystemExit(f'{name} is imported by {users}, not run: run the example itself '
                     '(--help lists its options).')


if __name__ == '__main__':
    answer(__doc__, 'module_help.py', "the examples' helper modules")
