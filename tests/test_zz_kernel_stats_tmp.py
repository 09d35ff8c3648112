from tests.test_kernel import CASES, draw, outcomes, zoo_db  # noqa: F401


def test_stats(outcomes):
    total = 0
    for name, o in outcomes.items():
        case = CASES[name]
        lit = len(dict.fromkeys([*case.values, *draw(case.drawn)]))
        written = [x for x in o.written if x is not None]
        errors = sum(e is not None for e in o.spark_errors)
        total += len(o.texts)
        print(f"STAT {name:32} literals={lit:4} written={len(written):4} texts={len(o.texts):4} errors={errors:4}")
    print("STAT total texts", total)
