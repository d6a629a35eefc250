"""``python -m expreplay``: print the version, the active C kernels and the importable extras."""

from ._info import report

if __name__ == '__main__':
    print(report())
