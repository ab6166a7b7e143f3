"""Stage 5, lower: emit a readable PyTorch module from the module tree and its programs (compiler/ir.py).

One class per distinct block (identical instances share a class; the layers of a stack that a block
makes differently by their index share one that takes the index, compiler/layer_choice.py; a boolean
parameter's `if`s stay a choice of the classes they change, compiler/flag_choice.py), and in each
`forward` one line per step of its program, with a comment naming the spec line it comes from: an op, a
block call, a spec function (a nested `def`), a function's call, and a repeated stack as one `for` loop
over an `nn.ModuleList`. Lowering reads the graph's nodes and the programs; of the spec's syntax, only
the condition of an `if` by which a layer's block chooses its modules.

The module is built as a Python syntax tree (compiler/python_code.py), never as text read back: classes
compare, merge and choose by their trees, and a statement's comment is a note it carries. Names in it are
identifiers the graph builder checked (compiler/names.py), or made here from them; text from the spec
(file names, string values) is escaped for the docstring or comment it lands in. The tree is checked
(compiler/codecheck.py) and printed (compiler/python_print.py, which proves the text parses back to it)
before anything compiles or runs it.
"""

from __future__ import annotations

import ast as pyast
import copy
import dataclasses
import functools
import itertools
from typing import Callable, Hashable, Mapping, Optional, Sequence, Union

from .code_reads import attributes_read, config_argument, config_field, names_used
from .codecheck import check_module
from .config import ConfigNames, config_expression, config_fields, derived_field
from .diagnostics import Span
from .entries import DECODER, ENCODER, MEMORY, TOKEN_TYPES
from .flag_choice import condition_fields, flag_ifs, flipped, forcing, merged_class, owns, renamed, spec_line
from .forward import Arguments, Context, file_label, forward_method, where
from .ir import Instance, OpGraph, Program, Step, lint_program
from .layer_branches import KindFlag, apart, differing_steps, flag_statements, kind_flags, merged_program
from .layer_choice import (Choice, Modules, Truths, Untaken, branch_name, branch_guards, chooses_alike,
                           indexed_constructor, layer_kinds, one_forward, untaken_branches)
from .library import MODULE, LibraryClass, library_classes, resetting_classes, with_bases
from .names import class_name, local_name_problem, module_name_problem
from .ops import OPS
from .python_code import (assign, attribute, binary, call, class_def, constant, docstring, dotted, expression,
                          for_loop, function, identifier, if_statement, note_of, noted, returns, statements_in,
                          super_init, text_of, variable)
from .python_print import INDENT, LINE_LIMIT, print_checked
from .resolve import ResolvedModel
from .shapes import TensorType
from .tie_choice import TieGroup, tie_groups
from .validate import ValidatedModel

# torch's modules a generated file may import, as it names them.
MODULES = (("torch", None, "torch"), ("torch.nn", "nn", "nn"), ("torch.nn.functional", "F", "F"))

# A block of the file: generated statements, or a library class copied whole (a standalone file).
Block = Union[pyast.stmt, LibraryClass]


class Lowered:
    """The generated module: `source` imports the op library (`from xspec.nn import ...`); `standalone`
    copies the library classes it uses instead and depends on torch alone (made, and checked, when first
    asked for: most compilations never write it)."""

    def __init__(self, source: str, standalone: Callable[[], str]) -> None:
        self.source = source
        self._standalone = standalone

    @functools.cached_property
    def standalone(self) -> str:
        text = self._standalone()
        check_module(text)
        return text


def _library_used(named: set[str]) -> set[str]:
    """The library classes among the names generated code uses (`RMSNorm(`, not `nn.RMSNorm(`). Library
    classes construct none of each other (an attention's rotary embedding is built by the generated code
    and passed in), so the file needs these and, where it copies them, the classes they extend."""
    return named & set(library_classes())


# The model built with the `if` statements given (by id) taking the branches given; None where it does not
# check (compiler/pipeline.py).
BuiltWith = Callable[[Mapping[int, bool]], Optional[ValidatedModel]]


def lower(model: ResolvedModel, validated: ValidatedModel, built_with: BuiltWith) -> Lowered:
    return _Lowering(model, validated, _Builds(built_with)).module_sources()


# Models built with `if`s forced, each a whole model's build: a spec of many stacks lowers in bounded time.
MAX_FORCED_BUILDS = 4
# A parameter that names a rate, not what a parameter-free module holding it is (`dropout_rate`).
RATE_SUFFIXES = ("_rate", "_prob", "_probability")


class _Builds:
    """`built_with`, each forcing built once and at most MAX_FORCED_BUILDS of them (beyond: None, so the
    branches are refused by name, and `refused` counts it). `forcing` gives the builds of a model with more
    `if`s forced (a flag's other build), sharing the bound."""

    def __init__(self, built_with: BuiltWith, forced: Optional[Mapping[int, bool]] = None,
                 built: Optional[dict[frozenset[tuple[int, bool]], Optional[ValidatedModel]]] = None,
                 refused: Optional[list[int]] = None) -> None:
        self.built_with, self.forced = built_with, dict(forced or {})
        self.built = built if built is not None else {}
        self.refusals = refused if refused is not None else [0]

    def __call__(self, forced: Mapping[int, bool]) -> Optional[ValidatedModel]:
        key = frozenset({**self.forced, **forced}.items())
        if key not in self.built:
            within = len(self.built) < MAX_FORCED_BUILDS
            self.refusals[0] += not within
            self.built[key] = self.built_with(dict(key)) if within else None
        return self.built[key]

    def forcing(self, forced: Mapping[int, bool]) -> _Builds:
        return _Builds(self.built_with, {**self.forced, **forced}, self.built, self.refusals)

    @property
    def refused(self) -> int:
        return self.refusals[0]


def _field_type(value: object, optional: bool) -> pyast.expr:
    """A config field's annotation: `int`, `tuple[str, ...]` for a schedule of one type, `int | None` for
    a field computed from the others unless given."""
    annotation: pyast.expr = variable(type(value).__name__)
    items = {type(item).__name__ for item in value} if isinstance(value, tuple) else set()
    if len(items) == 1:
        each = pyast.Tuple([variable(items.pop()), pyast.Constant(...)], pyast.Load())
        annotation = pyast.Subscript(annotation, each, pyast.Load())
    return binary(annotation, pyast.BitOr(), constant(None)) if optional else annotation


def _class_key(cls: pyast.ClassDef) -> str:
    """What makes two classes one: their code and their comments' spec lines, not their names or the
    dimensions their shape comments name (layers that differ only in their lengths share a class)."""
    notes = [note.text for statement in statements_in(cls) if (note := note_of(statement)) is not None]
    return text_of(pyast.Module(cls.body, [])) + repr([text_of(base) for base in cls.bases]) + repr(notes)


def _merge_shapes(kept: pyast.ClassDef, other: pyast.ClassDef) -> None:
    """`kept`'s shape comments naming both classes' dimensions where they differ (`[batch, src_len|tgt_len,
    d_model]`); the two are the same code."""
    for mine, theirs in zip(statements_in(kept), statements_in(other)):
        a, b = note_of(mine), note_of(theirs)
        if a is not None and b is not None and a.shape != b.shape:
            noted(mine, a.merged(b))


class _Lowering:
    def __init__(self, model: ResolvedModel, validated: ValidatedModel, built_with: _Builds) -> None:
        self.model, self.validated, self.built_with = model, validated, built_with
        self.graph = validated.graph.graph
        self.classes: dict[str, str] = {}  # class key (_class_key) -> class name
        self.class_of: dict[str, str] = {}  # instance path -> class name
        self.trees: dict[str, pyast.ClassDef] = {}  # class name -> its tree
        self.layer_classes: dict[str, list[str]] = {}  # stack path -> the class of each layer
        self.indexed: dict[str, str] = {}  # stack path -> the name its layers' one class takes the index by
        # block -> its layers' one class that takes the index, and the stack's layers and their own classes
        self.by_index: dict[str, tuple[str, Instance, list[pyast.ClassDef]]] = {}
        self.index_args: dict[str, pyast.expr] = {}  # block call path -> the index its class is built with
        self.order: list[pyast.ClassDef] = []  # classes in definition order
        self.library = set(library_classes())  # names generated classes do not take
        self.model_class = class_name(model.name, self.library)
        self.config_class = class_name(f"{model.name}_config", {*self.library, self.model_class})
        self.fields = config_fields(model.params)
        self.names = ConfigNames(self.fields)
        self.widths: dict[str, pyast.expr] = {}  # node id -> its output's last size, as generated code writes it
        # instance -> the constructor's code -> (attribute, constructor, line)
        self.holders: dict[str, dict[str, tuple[str, pyast.expr, Span]]] = {}
        self.context = Context(self.graph, validated.graph.tensors, self.names, self._holder,
                               condition_fields(list(model.blocks.values())), self._width)

    def module_sources(self) -> Lowered:
        root = self.validated.graph.root
        self._define_children(root, "")
        self._choose_by_flags()
        model_class = self._model_class()
        library = _library_used(names_used(*self.order, *model_class))
        generated: list[pyast.stmt] = [*self.order, *model_class]
        config = self._config([*self.order, *model_class])
        source = self._module([config, *generated], library)
        copies = [library_classes()[name] for name in with_bases(library)]
        return Lowered(source, lambda: self._module([config, *copies, *generated], set()))

    def _module(self, body: Sequence[Block], imported: set[str]) -> str:
        """The file: its docstring, the imports `body` reads (a file reads clean under a linter), `body`;
        checked as the tree it is, and printed."""
        doc = (f"Model '{self.model.name}' ({self.validated.parameter_count:,} parameters), generated by xspec "
               f"from\n{file_label(self.model.span.file)}: edit the spec, not this file.")
        trees = [block.node if isinstance(block, LibraryClass) else block for block in body]
        standard: list[pyast.stmt] = [pyast.Import([pyast.alias("math")])] if attributes_read(*trees, owner="math") \
            else []
        standard.append(pyast.ImportFrom("dataclasses", [pyast.alias("dataclass")], 0))
        torch: list[pyast.stmt] = [pyast.Import([pyast.alias(module, alias)]) for module, alias, name in MODULES
                 if attributes_read(*trees, owner=name)]
        names = [pyast.alias(name) for name in sorted(imported)]
        library: list[pyast.stmt] = [pyast.ImportFrom(MODULE, names, 0)] if imported else []
        groups: list[list[pyast.stmt]] = [[docstring(doc)], standard, torch, library]
        header = [statements for statements in groups if statements]
        if not any(isinstance(block, LibraryClass) for block in body):
            tree = pyast.Module([statement for group in header for statement in group], [])
            tree.body += [block for block in body if not isinstance(block, LibraryClass)]
            check_module(tree)
        text = "\n\n".join(print_checked(group).rstrip("\n") for group in header)
        blocks = [block.source if isinstance(block, LibraryClass) else print_checked([block]) for block in body]
        return "\n\n\n".join(part.rstrip("\n") for part in [text, *blocks]) + "\n"

    # --- classes ------------------------------------------------------------------------------
    def _define(self, instance: Instance, base: str) -> str:
        """Emit the class of a block instance (children first) and return its name. `base` is the
        block's name, from which the class is named (`encoder_layer` -> `EncoderLayer`)."""
        self._define_children(instance, base)
        cls = self._class(instance)
        indexed = self._layer_class_at(instance, cls)
        if indexed is not None:
            self.class_of[instance.path] = indexed
            return indexed
        return self._register(instance, base, cls)

    def _layer_class_at(self, instance: Instance, cls: pyast.ClassDef) -> Optional[str]:
        """Where `instance` calls a block whose layers are one class taking the index (`lm_layer(x, layers)`
        after `repeat i in layers { x = lm_layer(x, i) }`), and that class built with the index given makes
        what `cls` makes, that class: it is then built with that index (DeepSeek-V3's multi-token prediction
        layer), not written again."""
        found = self.by_index.get(instance.block_name or "")
        if found is None:
            return None
        name, stack, classes = found
        index = stack.index_param
        assert index is not None
        if index not in instance.constant_args:
            return None
        expression_, value = instance.constant_args[index]
        if not isinstance(value, int) or isinstance(value, bool):
            return None
        block = self.model.blocks[instance.block_name or ""]
        key = _class_key(cls)
        same = [layer for layer, layer_class in enumerate(classes) if _class_key(layer_class) == key]
        if not same or not chooses_alike(block, index, value, same[0], self.fields):
            return None
        written = config_expression(expression_, value, self.fields, lambda name: None)
        self.index_args[instance.path] = written if written is not None else constant(value)
        return name

    def _define_children(self, instance: Instance, base: str) -> None:
        for child in instance.children.values():
            if child.kind == "block":
                self._define(child, child.block_name or f"{base}_layer")
            elif child.kind == "stack":
                self.layer_classes[child.path] = self._define_layers(child, base)

    def _define_layers(self, stack: Instance, base: str) -> list[str]:
        """The class of each layer of a stack. Layers differ where the first changes the width the others
        see (`x = linear(x, 4)` on 8 features), a value carried from layer to layer changes what a layer
        computes, or the block chooses modules by the layer's index. Those the block's conditions choose are
        one class that takes the index (compiler/layer_choice.py), branching on the layer's kind where kinds
        compute differently (compiler/layer_branches.py); the branches no layer takes at the spec's values
        are written too, from the model built with them taken."""
        layers = list(stack.children.values())
        bases = [item.block_name or f"{base}_layer" for item in layers]
        for item, item_base in zip(layers, bases):
            self._define_children(item, item_base)
        classes = [self._class(item) for item in layers]
        block = self.model.blocks[layers[0].block_name] if layers[0].block_name is not None else None
        if stack.index_param is not None and block is not None:
            index = stack.index_param
            untaken = untaken_branches(block, index, len(layers), self.fields)
            before = self._registry()
            # The untaken branches written, from a model that takes them; else (none checks) refused by name.
            for forced in self._forcings(untaken):
                built = self._untaken_layers(stack, forced, bases[0])
                names = self._chosen_classes(stack, layers, classes, built, [], forced) if built else None
                if names is not None:
                    return names
                self._restore(before)
            names = self._chosen_classes(stack, layers, classes, [], branch_guards(untaken, index), {})
            if names is not None:
                return names
            self._restore(before)
        return [self._register(item, item_base, cls) for item, item_base, cls in zip(layers, bases, classes)]

    def _chosen_classes(self, stack: Instance, layers: list[Instance], classes: list[pyast.ClassDef],
                        untaken: list[tuple[Instance, pyast.ClassDef, Modules, ValidatedModel]],
                        guards: list[pyast.stmt], forced: Mapping[int, bool]) -> Optional[list[str]]:
        """The one class of `layers` (their `classes`) where the block's conditions choose their modules, and
        their kinds where their forwards differ; it takes the index. `untaken`: layers built with the branches
        no layer takes (`forced`), with their classes, modules and that model, written into the class too;
        `guards` refuse those branches instead. None where the conditions do not explain the classes."""
        index, block = stack.index_param, self.model.blocks[layers[0].block_name or ""]
        assert index is not None
        every = [*layers, *(layer for layer, _, _, _ in untaken)]
        every_class = [*classes, *(cls for _, cls, _, _ in untaken)]
        if not guards and len({_class_key(cls) for cls in every_class}) == 1:
            return None  # the same class, which needs no index
        truths = Truths(block, index, self.fields, len(layers), forced)
        optional = {keyword for op in OPS.values() for keyword in op.optional_keywords}
        modules = [*map(self._modules, layers), *(made for _, _, made, _ in untaken)]
        constructor = indexed_constructor(truths, every, modules, optional)
        if constructor is None:
            return None
        forwards = [method for cls in every_class for method in cls.body[-1:] if isinstance(method, pyast.FunctionDef)]
        kinds: dict[str, list[int]] = {}
        for position, method in enumerate(forwards):
            kinds.setdefault(text_of(method), []).append(position)
        flags: list[KindFlag] = []
        forward = one_forward(forwards) if len(kinds) == 1 else None
        if forward is not None:
            for other in every_class[1:]:
                _merge_shapes(every_class[0], other)   # whose forward it is
        else:
            foreign = {id(layer): built for layer, _, _, built in untaken}
            representative = {key: every[positions[0]] for key, positions in kinds.items()}
            kind_of = {position: key for key, positions in kinds.items() for position in positions}
            branching = self._branching_forward([kind_of[position] for position in range(len(every))], truths,
                                                representative, foreign, constructor)
            if branching is None:
                return None
            forward, flags = branching
        first = layers[0]
        note = where(first.block_span) if first.block_span else where(first.span)
        doc = f"block {first.block_name}, {note}" if first.block_span else f"a layer of the repeat at {note}"
        init = [super_init(), *guards, *flag_statements(flags), *constructor]
        one = class_def("Layer", [dotted("nn.Module")], [function("__init__", ["self", "config", index], init),
                                                         forward], doc)
        name = self._register(first, first.block_name or "layer", one)
        for item in layers:
            self.class_of[item.path] = name
        self.indexed[stack.path] = index
        self.by_index[block.name.id] = (name, stack, classes)
        return [name] * len(layers)

    def _branching_forward(self, kinds: list[str], truths: Truths, representative: dict[str, Instance],
                           foreign: dict[int, ValidatedModel], constructor: list[pyast.stmt]
                           ) -> Optional[tuple[pyast.FunctionDef, list[KindFlag]]]:
        """The forward of layers of several kinds (`kinds`: each layer's, by its forward's code;
        `representative`: a layer of each), which the block's conditions tell apart, and what the constructor
        keeps of a layer's kind for it to branch on. A layer of a model built with untaken branches taken
        (`foreign`: that model) is written with its values renamed apart. None where no conditions tell the
        kinds apart, the forwards do not merge, or the merged one holds a module no constructor statement
        makes."""
        layers = dict(representative)
        graph, tensors = self.graph, dict(self.context.tensors)
        for key, layer in representative.items():
            if id(layer) in foreign:
                layers[key], nodes, renamed = apart(layer, foreign[id(layer)].graph, f"untaken{len(tensors)}:")
                graph = OpGraph.of({**graph.nodes, **nodes})
                tensors.update(renamed)
        # One layer of every kind's modules; where kinds hold one name (Nemotron-H's `mixer`), the block's, whose
        # calls read the child (an op's read its node).
        children = {name: child for layer in layers.values() for name, child in layer.children.items()}
        children.update({name: child for layer in layers.values() for name, child in layer.children.items()
                         if child.kind == "block"})
        first = dataclasses.replace(layers[next(iter(layers))], children=children,
                                    has_cache=any(item.has_cache for item in layers.values()),
                                    has_token_types=any(item.has_token_types for item in layers.values()))
        signature = functools.partial(self._step_signature, first)
        taken = set(children) | {name for layer in layers.values()
                                 for name, _, _ in self.holders.get(layer.path, {}).values()}
        flags: dict[str, KindFlag] = {}

        def merged(part: Choice) -> Optional[Program]:
            if isinstance(part, str):
                return layers[part].program
            condition, span, yes, no = part
            over_kind = kind_flags(condition, truths.index, flags, taken, where(span),
                                   f"is_{branch_name(truths.block, span)}")
            mine, theirs = merged(yes), merged(no)
            if mine is None or theirs is None:
                return None
            return merged_program(mine, theirs, over_kind, span, signature)

        own_graph, own_context = self.graph, self.context
        self.graph, self.context = graph, dataclasses.replace(self.context, graph=graph, tensors=tensors)
        try:
            choice = layer_kinds(truths, kinds, self._differing_spans(list(layers.values()), signature))
            program = merged(choice) if choice is not None else None
            if program is None:
                return None
            layer = dataclasses.replace(first, program=program)
            lint_program(layer, graph)
            forward = forward_method(self.context, layer)
        finally:
            self.graph, self.context = own_graph, own_context
        made = {text_of(part) for statement in constructor for part in statements_in(statement)}
        held = self.holders.get(first.path, {}).values()
        if any(text_of(assign(f"self.{name}", code)) not in made for name, code, _ in held):
            return None  # a module the forward holds that no constructor statement makes
        return forward, list(flags.values())

    def _differing_spans(self, layers: list[Instance], signature: Callable[[Step], Hashable]) -> list[Span]:
        """Where the spec writes what some of `layers` compute and others do not: the ops and block calls of
        the steps two of them do not share."""
        spans = []
        for mine, theirs in itertools.combinations(layers, 2):
            for step in differing_steps(mine.program, theirs.program, signature) or []:
                if step.kind == "op":
                    spans.append(self.graph[step.target].span)
                elif step.kind == "block":
                    spans.append(next(layer.children[step.target].span for layer in (mine, theirs)
                                      if step in layer.program.steps))
                else:
                    spans.append(step.span)
        return spans

    def _step_signature(self, instance: Instance, step: Step) -> Hashable:
        """What a step of a layer's program computes, as its forward writes it but for the values it reads: two
        kinds' steps of one signature may be one (compiler/layer_branches.py)."""
        if step.programs():
            return id(step)  # a loop or function: its own
        if step.kind == "op":
            node = self.graph[step.target]
            op = OPS[node.op]
            attribute_name = node.id.rsplit(".", 1)[-1] if op.module is not None else "held"
            code = op.call(identifier(attribute_name), {port: variable(port) for port in step.inputs}, node.attrs,
                           op.uses_cache and instance.has_cache)
            holder = text_of(op.holder(node.attrs, Arguments(node))) if op.holder is not None else None
            held = tuple(name for name in op.forward_attrs if name in node.sources)
            return "op", text_of(code), holder, held
        if step.kind == "block":
            child = instance.children[step.target]
            return "block", step.target, child.has_cache, child.has_token_types
        return step.kind, step.target, step.argument

    def _forcings(self, untaken: list[Untaken]) -> list[dict[int, bool]]:
        """The `if`s to force for a stack's `untaken` branches: every stack's together, where they agree with
        this one's (one build serves them all), then this stack's alone."""
        mine = {id(item.statement): item.branch for item in untaken}
        together = self.everywhere if all(self.everywhere.get(k) == taken for k, taken in mine.items()) else mine
        return ([together] if mine else []) + ([mine] if mine and together != mine else [])

    @functools.cached_property
    def everywhere(self) -> dict[int, bool]:
        """The untaken branches of every stack whose block reads the index, each `if` taking the branch its
        stacks lack (one two stacks would force each its own way left out)."""
        forced: dict[int, bool] = {}
        conflicting: set[int] = set()
        pending = [self.validated.graph.root]
        while pending:
            node = pending.pop()
            pending += node.children.values()
            first = next(iter(node.children.values()), None)
            if node.kind != "stack" or node.index_param is None or first is None or first.block_name is None:
                continue
            block = self.model.blocks[first.block_name]
            for item in untaken_branches(block, node.index_param, len(node.children), self.fields):
                if forced.setdefault(id(item.statement), item.branch) != item.branch:
                    conflicting.add(id(item.statement))
        return {key: taken for key, taken in forced.items() if key not in conflicting}

    def _untaken_layers(self, stack: Instance, forced: Mapping[int, bool], base: str
                        ) -> list[tuple[Instance, pyast.ClassDef, Modules, ValidatedModel]]:
        """The layers of `stack` as the model builds them with the `if`s `forced`, each with its class (the
        classes they use written into this file), its modules and that model; none where that model does
        not check."""
        built = self.built_with(forced)
        if built is None:
            return []
        other = built.graph.root
        for part in stack.path.split("."):
            other = other.children[part]
        lowering = _Lowering(self.model, built, self.built_with)
        lowering.classes, lowering.trees, lowering.order = self.classes, self.trees, self.order  # one file
        lowering.everywhere = self.everywhere
        layers = list(other.children.values())
        for layer in layers:
            lowering._define_children(layer, base)
        classes = [lowering._class(layer) for layer in layers]   # first: the forwards name what they hold
        return [(layer, cls, lowering._modules(layer), built) for layer, cls in zip(layers, classes)]

    def _registry(self) -> tuple[dict[str, str], dict[str, pyast.ClassDef], int]:
        return dict(self.classes), dict(self.trees), len(self.order)

    def _restore(self, registry: tuple[dict[str, str], dict[str, pyast.ClassDef], int]) -> None:
        """The classes as they were before an attempt at a stack's layers wrote its own (the untaken
        branches' layers' classes among them)."""
        classes, trees, count = registry
        self.classes.clear()
        self.classes.update(classes)
        self.trees.clear()
        self.trees.update(trees)
        del self.order[count:]

    def _register(self, instance: Instance, base: str, cls: pyast.ClassDef, key: Optional[str] = None) -> str:
        """The class of `cls` (whose _class_key is `key`, where known): one written before with the same code
        (its shape comments merged), or `cls`, named after `base`."""
        key = key if key is not None else _class_key(cls)
        name = self.classes.get(key)
        if name is not None:
            _merge_shapes(self.trees[name], cls)
        else:
            # Not a name another class, a library class, the model class or the code's own names have.
            name = class_name(base, {*self.classes.values(), *self.library, self.model_class,
                                     self.config_class})
            self.classes[key] = name
            cls.name = name
            self.trees[name] = cls
            self.order.append(cls)
        self.class_of[instance.path] = name
        return name

    def _class(self, instance: Instance) -> pyast.ClassDef:
        """A block instance's class (named when registered): a constructor of one assignment per module it
        holds, and its forward."""
        doc = (f"block {instance.block_name}, {where(instance.block_span)}" if instance.block_span
               else f"a layer of the repeat at {where(instance.span)}")
        forward = forward_method(self.context, instance)  # first: it names the modules it needs held
        init = [super_init(), *self._modules(instance).values()]
        return class_def("Layer", [dotted("nn.Module")], [function("__init__", ["self", "config"], init), forward],
                         doc)

    def _modules(self, instance: Instance) -> Modules:
        """The modules a block instance's constructor makes, by attribute: its children, then what its forward
        holds (written after the forward)."""
        made: Modules = {}
        for name, child in instance.children.items():
            constructor = self._constructor(child)
            if constructor is not None:
                made[identifier(name)] = assign(f"self.{identifier(name)}", constructor, where(child.span))
        for attribute_name, constructor, span in self.holders.get(instance.path, {}).values():
            made[attribute_name] = assign(f"self.{attribute_name}", constructor, where(span))
        return made

    def _constructor(self, child: Instance) -> Optional[pyast.expr]:
        if child.kind == "op":
            assert child.node is not None
            node = self.graph[child.node]
            module = OPS[node.op].module
            assert module is not None
            return module(node.attrs, node.inferred, Arguments(node, self._width))
        if child.kind == "stack":
            classes = self.layer_classes[child.path]
            count = child.count_source if child.count_source is not None else constant(len(classes))
            if child.path in self.indexed or len(set(classes)) == 1:
                index = self.indexed.get(child.path, "_")
                arguments = [variable("config")] + ([variable(index)] if child.path in self.indexed else [])
                layers = pyast.ListComp(call(classes[0], *arguments), [pyast.comprehension(
                    pyast.Name(index, pyast.Store()), call("range", count), [], 0)])
                return call("nn.ModuleList", layers)
            # flat: no deep expression
            return call("nn.ModuleList", pyast.List([call(name, variable("config")) for name in classes], pyast.Load()))
        given = self.index_args.get(child.path)
        return call(self.class_of[child.path], variable("config"), *([given] if given is not None else []))

    def _holder(self, instance: Instance, node_id: str, constructor: pyast.expr) -> str:
        """The attribute of `instance`'s class that holds a parameter-free module, or a value its forward reads
        (forward.py: computed from the config). A module is named after the spec's parameter it reads
        (`self.dropout = nn.Dropout(config.dropout)`), less a rate's suffix (`self.dropout` of
        `config.dropout_rate`, `self.hidden_dropout` of `config.hidden_dropout_prob`: a module, not a number);
        a value after the parameter it is, where it is one read bare; else either after the op (T5's
        `self.scale = 1 / math.sqrt(config.d_model)`)."""
        held = self.holders.setdefault(instance.path, {})
        key = text_of(constructor)
        if key not in held:
            parameter = config_argument(constructor)
            base = _without_rate(parameter) if parameter is not None else \
                config_field(constructor) or self.graph[node_id].op
            taken = {*instance.children, *(attribute_name for attribute_name, _, _ in held.values())}
            name = base
            for n in itertools.count(2):
                if name not in taken and module_name_problem(name) is None and local_name_problem(name) is None:
                    break
                name = f"{base}_{n}"
            held[key] = (name, constructor, self.graph[node_id].span)
        return held[key][0]

    def _width(self, node_id: str) -> pyast.expr:
        """The last size of a node's output as the spec's expressions give it: the attribute of the op that
        made it (OpDef.width), through the ops that keep an input's (a norm, attention, an addition). A
        graph input's reads the one parameter of its value, if one only."""
        pending = [node_id]
        while pending:
            node = self.graph[pending[-1]]
            if node.id in self.widths:
                pending.pop()
                continue
            own, size = OPS[node.op].width, node.checked_shape().dims[-1]
            kept = [source for source in node.inputs.values()
                    if (self.graph[source].shape or TensorType(())).dims[-1:] == (size,)]
            if OPS[node.op].joins:
                missing = [source for source in node.inputs.values() if source not in self.widths]
                if missing:
                    pending += missing  # its inputs' first
                    continue
                total = self.widths[node.inputs[next(iter(node.inputs))]]
                for source in list(node.inputs.values())[1:]:
                    total = binary(total, pyast.Add(), self.widths[source])
                self.widths[node.id] = total
            elif own is not None:
                self.widths[node.id] = Arguments(node, self._width).attr(own)
            elif (width_of := OPS[node.op].width_of) is not None:
                self.widths[node.id] = width_of(node.attrs, Arguments(node, self._width))
            elif not kept:
                self.widths[node.id] = self.names.size(size)
            elif kept[0] in self.widths:
                self.widths[node.id] = self.widths[kept[0]]
            else:
                pending.append(kept[0])  # its input's first (a stack of thousands of layers: no recursion)
                continue
            pending.pop()
        return self.widths[node_id]

    # --- boolean parameters kept as choices -----------------------------------------------------
    def _choose_by_flags(self) -> None:
        """Each flag (a boolean parameter, or a string one of two listed values) that the used blocks' `if`s
        read alone, kept as a choice of the classes it changes: the model built with it the other way, lowered,
        and each class merged with its other build's (compiler/flag_choice.py). A class that two flags change
        stays as the first leaves it."""
        blocks_of = self._blocks_of_classes()  # class -> the block its instances are
        used = [self.model.blocks[name] for name in dict.fromkeys(blocks_of.values()) if name in self.model.blocks]
        flags = flag_ifs(used, self.model.expressions, self.model.written_ties, self.fields, self.model.choices)
        if not flags:
            return
        original = dict(self.trees)  # merging makes new classes of their statements; these stay as they are
        texts = {name: text_of(pyast.Module(tree.body, [])) for name, tree in original.items()}
        touched: set[str] = set()
        for field, ifs in flags.items():
            other_value = flipped(field, self.fields, self.model.choices)
            forced = forcing(ifs, field, other_value) if other_value is not None else None
            built = self.built_with(forced) if forced is not None else None
            if other_value is None or forced is None or built is None:
                continue
            tested = True if isinstance(other_value, bool) else other_value  # `if config.f`, `if config.f == v`
            holds = self.fields[field] == tested
            refused = self.built_with.refused
            other = _Lowering(self.model, built, self.built_with.forcing(forced))
            other._define_children(built.graph.root, "")
            changed = self._changed_classes(other, texts)
            # Only a class whose own block reads the flag may change with it; else the other build differs by
            # something else (its untaken branches refused by the bound on builds).
            blocks = {name: self.model.blocks.get(blocks_of.get(name, "")) for name in changed or {}}
            if not changed or touched & set(changed) or self.built_with.refused > refused or \
                    not all(block is not None and owns(block, ifs) for block in blocks.values()):
                continue
            merged: dict[str, pyast.ClassDef] = {}
            for name, tree in changed.items():
                one = merged_class(original[name], tree, field, tested, holds, spec_line(ifs, blocks[name]))
                if one is not None:
                    merged[name] = one
            if len(merged) < len(changed):
                continue
            for name, tree in merged.items():
                self.order[self.order.index(self.trees[name])] = self.trees[name] = tree
            touched |= set(changed)

    def _changed_classes(self, other: _Lowering, texts: dict[str, str]) -> Optional[dict[str, pyast.ClassDef]]:
        """This file's classes (their code: `texts`) that `other`'s build makes otherwise: each, as the other
        build writes it (its classes renamed as here, in place: `other` is not used after). None where its
        classes are not one to one with this file's."""
        names: dict[str, str] = {}  # the other build's class -> this file's
        for path, theirs in other.class_of.items():
            mine = self.class_of.get(path)
            if mine is None or names.setdefault(theirs, mine) != mine:
                return None
        if len(set(names.values())) != len(names):
            return None
        unnamed = set(other.trees) - set(names)  # classes of its untaken branches' layers alone
        changed = {}
        for theirs, mine in names.items():
            tree = renamed(other.trees[theirs], names)
            if names_used(tree) & unnamed:
                return None
            if text_of(pyast.Module(tree.body, [])) != texts[mine]:
                changed[mine] = tree
        return changed

    def _blocks_of_classes(self) -> dict[str, str]:
        """Each class's block: that of its instances."""
        found: dict[str, str] = {}
        pending = [self.validated.graph.root]
        while pending:
            instance = pending.pop()
            pending += instance.children.values()
            name = self.class_of.get(instance.path)
            if name is not None and instance.block_name is not None:
                found.setdefault(name, instance.block_name)
        return found

    # --- the file around the classes ----------------------------------------------------------
    def _config(self, classes: Sequence[pyast.stmt]) -> pyast.ClassDef:
        """The spec's parameters that the code reads, as a dataclass (nanoGPT's GPTConfig): every class
        takes it. A parameter the spec computes from others (`d_k = d_model / heads`) is None unless
        given and computed from them after (`__post_init__`), so an edited config builds what --set builds."""
        derived = self._derived_fields()  # name -> (Python over `self`, the fields it reads)
        used = set(attributes_read(*classes, owner="config")) & set(self.fields)
        pending = [name for name in used if name in derived]
        while pending:  # and the parameters the computed ones read
            for name in derived[pending.pop()][1]:
                if name not in used:
                    used.add(name)
                    pending += [name] if name in derived else []
        fields: list[pyast.stmt] = [
            pyast.AnnAssign(pyast.Name(name, pyast.Store()), _field_type(value, optional=name in derived),
                            constant(None if name in derived else value), 1)
            for name, value in self.fields.items() if name in used]
        doc = f"The parameters of {file_label(self.model.span.file)} that sizes and rates are read from."
        body: list[pyast.stmt] = [docstring(doc), *(fields or [pyast.Pass()])]
        computed = [name for name in _dependency_order(derived) if name in used]
        if computed:
            steps: list[pyast.stmt] = []
            for name in computed:
                field = dotted(f"self.{name}")
                missing = pyast.Compare(dotted(f"self.{name}"), [pyast.Is()], [constant(None)])
                line = assign(field, pyast.IfExp(missing, derived[name][0], dotted(f"self.{name}")))
                if len(INDENT * 2 + text_of(line)) < LINE_LIMIT:
                    steps.append(line)
                else:
                    steps.append(if_statement(missing, [assign(dotted(f"self.{name}"), derived[name][0])]))
            body.append(function("__post_init__", ["self"], steps,
                                 "None: computed from the others, as the spec does"))
        return class_def(self.config_class, [], body, decorators=[variable("dataclass")])

    def _derived_fields(self) -> dict[str, tuple[pyast.expr, list[str]]]:
        """The config's fields the spec computes from other fields: name -> Python over `self`, and the
        fields it reads."""
        derived = {}
        for name, value in self.fields.items():
            expression_ = self.model.expressions.get(name)
            code = derived_field(expression_, value, self.fields) if expression_ is not None else None
            if code is not None:
                derived[name] = (code, attributes_read(code, owner="self"))
        return derived

    def _ties(self) -> list[pyast.stmt]:
        """The ties, each group under its condition over the config where the spec's `if` stays a choice
        (compiler/tie_choice.py)."""
        groups = tie_groups(self.model.written_ties, self.model.blocks.values(), self.fields, self.validated)
        statements: list[pyast.stmt] = []
        for group in groups:
            if group.condition is None or group.span is None:
                statements += self._tie_statements(group, depth=2)
            elif group.ties:
                statements.append(if_statement(group.condition, self._tie_statements(group, depth=3), (),
                                               where(group.span)))
        return statements

    def _tie_statements(self, group: TieGroup, depth: int) -> list[pyast.stmt]:
        """One assignment per tied tensor, except where a tensor of every layer of a stack is tied to the
        first layer's, or to one tensor outside the stack: one loop over the stack for it (a tied stack of
        9,000 layers is a few lines). `depth`: the statements' indentation."""
        ties, span_of = dict(group.ties), group.spans
        statements: list[pyast.stmt] = []
        for stack, count in _stack_sizes(self.validated.graph.root).items():
            first, shared = f"{stack}.0.", []
            for owner in sorted({o for o in ties.values() if o.startswith(first)}):
                layers = [f"{stack}.{i}.{owner[len(first):]}" for i in range(1, count)]
                if count > 2 and all(ties.get(t) == owner for t in layers):
                    shared.append(owner)
                    for tensor in layers:
                        del ties[tensor]
            if shared:  # layer 0 assigns its own tensors to itself: harmless
                written = span_of[f"{stack}.1.{shared[0][len(first):]}"]
                body = [assign(_attribute(o[len(first):], "layer"), _attribute(o)) for o in shared]
                statements.append(for_loop("layer", _attribute(stack), body, f"tie, {where(written)}"))
            outside = {tied[len(first):]: owner for tied, owner in ties.items()
                       if tied.startswith(first) and not owner.startswith(f"{stack}.")}
            each = {name: owner for name, owner in outside.items()
                    if (count > 1 or f"{first}{name}" in group.every_layer)
                    and all(ties.get(f"{stack}.{i}.{name}") == owner for i in range(count))}
            if each:
                written = span_of[f"{first}{next(iter(each))}"]
                body = [assign(_attribute(name, "layer"), _attribute(owner)) for name, owner in each.items()]
                statements.append(for_loop("layer", _attribute(stack), body, f"tie, {where(written)}"))
                for name in each:
                    for i in range(count):
                        del ties[f"{stack}.{i}.{name}"]
        shared_owner = None  # the tensor `shared` holds
        for tied, owner in ties.items():
            comment = f"tie, {where(span_of[tied])}"
            line = assign(_attribute(tied), _attribute(owner), comment)
            if len(INDENT * depth + text_of(line) + f"  # {comment}") >= LINE_LIMIT:  # the shared tensor first
                if owner != shared_owner:
                    statements.append(assign("shared", _attribute(owner), comment))
                    shared_owner = owner
                line = assign(_attribute(tied), variable("shared"), comment)
            statements.append(line)
        return statements

    def _model_class(self) -> list[pyast.stmt]:
        """The whole model's class, and `Model = ` it."""
        root = self.validated.graph.root
        name = self.model_class
        has_encoder, has_decoder = ENCODER in root.children, DECODER in root.children
        methods = ", ".join([*(["encode"] if has_encoder else []), *(["decode"] if has_decoder else []), "forward"])
        config = variable("config")
        given = pyast.Compare(variable("config"), [pyast.IsNot()], [constant(None)])
        # Ties in a method of transformers' name: called again after `to_empty`, which gives each name a tensor
        # of its own; the config kept where a tie's condition reads it.
        ties = self._ties()
        reads_config = bool(attributes_read(*ties, owner="config"))
        init: list[pyast.stmt] = [super_init(),
                                  assign("config", pyast.IfExp(given, config, call(self.config_class))),
                                  *([assign("self.config", config)] if reads_config else [])]
        for child in root.children.values():
            if child.kind == "stack":  # multi-token prediction's depths (DeepSeek-V3 §2.2)
                constructor = self._constructor(child)
                assert isinstance(constructor, pyast.Call)
                constructor.func = variable("MultiTokenPrediction")  # a list the runtime knows by its type
                init.append(assign(f"self.{child.name}", constructor, f"multi-token prediction, {where(child.span)}"))
            else:
                init.append(assign(f"self.{child.name}", call(self.class_of[child.path], variable("config"))))
        if ties:
            init.append(pyast.Expr(call("self.tie_weights")))
        body: list[pyast.stmt] = [function("__init__", ["self", "config"], init, defaults=[constant(None)])]
        if ties:
            body.append(function("tie_weights", ["self"], [
                docstring("The tensors the spec shares made one (again after to_empty)."),
                *([assign("config", dotted("self.config"))] if reads_config else []), *ties]))
        body.append(self._init_weights(ties, reads_config))
        none = [constant(None)]
        # An encoder whose ops read token types takes them after the padding mask (None: the first type's).
        typed = [TOKEN_TYPES] if has_encoder and root.children[ENCODER].has_token_types else []
        if has_encoder:
            read = ", [B, S] token types" if typed else ""
            body.append(function("encode", ["self", "src_tokens", "src_padding_mask", *typed], [
                docstring(f"[B, S] tokens, [B, S] True at padding{read} -> " +
                          ("[B, S, d_model] memory." if has_decoder else self._encoder_output())),
                returns(call("self.encoder", variable("src_tokens"), variable("src_padding_mask"),
                             *map(variable, typed)))], defaults=none * (1 + len(typed))))
        if has_decoder:
            memory = ["memory", "memory_padding_mask"] if has_encoder else []
            moved = pyast.AugAssign(pyast.Attribute(variable("cache"), "length", pyast.Store()), pyast.Add(),
                                    call("tgt_tokens.size", constant(1)))
            body.append(function("decode", ["self", "tgt_tokens", *memory, "cache"], [
                docstring("[B, T] tokens -> [B, T, vocab] logits; with a cache, only the new tokens."),
                assign("logits", call("self.decoder", variable("tgt_tokens"), *map(variable, memory),
                                      cache=variable("cache"))),
                if_statement(pyast.Compare(variable("cache"), [pyast.IsNot()], [constant(None)]), [moved]),
                returns(variable("logits"))], defaults=[constant(None)] * (2 if has_encoder else 1)))
        if has_encoder and has_decoder:
            forward = function("forward", ["self", "src_tokens", "tgt_tokens", "src_padding_mask", *typed], [
                assign("memory", call("self.encode", variable("src_tokens"), variable("src_padding_mask"),
                                      *map(variable, typed))),
                returns(call("self.decode", variable("tgt_tokens"), variable("memory"),
                             variable("src_padding_mask")))], defaults=none * (1 + len(typed)))
        elif has_decoder:
            forward = function("forward", ["self", "tgt_tokens"],
                               [returns(call("self.decode", variable("tgt_tokens")))])
        else:
            forward = function("forward", ["self", "src_tokens", "src_padding_mask", *typed], [
                returns(call("self.encode", variable("src_tokens"), variable("src_padding_mask"),
                             *map(variable, typed)))], defaults=none * (1 + len(typed)))
        body.append(forward)
        model = class_def(name, [dotted("nn.Module")], body, f"the whole model: {methods}")
        return [model, assign("Model", variable(name))]

    def _init_weights(self, ties: list[pyast.stmt], reads_config: bool) -> pyast.FunctionDef:
        """`init_weights()`, as torchtitan's models have it: every tensor set as the constructors set it, for a
        model built on the meta device and given memory on its own (xspec/nn/initialize.py). Each module's
        `reset_parameters()` (where its class sets tensors), children first in the order they were made, as
        `nn.Module.apply` visits them, so a seed gives the constructors' tensors; a tied tensor is first set
        on a tensor of its own, as construction set it, and tied again after (the owner's value stays)."""
        made = set(attributes_read(*self.order, owner="nn"))
        torch_names, library = resetting_classes(_library_used(names_used(*self.order)), made)
        classes = pyast.Tuple([*(dotted(f"nn.{name}") for name in torch_names), *map(variable, library)],
                              pyast.Load())
        reset = function("reset", ["module"], [if_statement(call("isinstance", variable("module"), classes),
                                                            [expression(call("module.reset_parameters"))])])
        untied = [_untied(statement) for statement in copy.deepcopy(ties)]
        return function("init_weights", ["self"], [
            docstring("Every tensor as the constructors set it, for a model built on the meta device."),
            *([assign("config", dotted("self.config"))] if reads_config else []), *untied, reset,
            expression(call("self.apply", variable("reset"))),
            *([expression(call("self.tie_weights"))] if ties else [])])

    def _encoder_output(self) -> str:
        """What an encoder alone returns: its logits over the vocabulary (a masked LM's), or its states."""
        width = self.graph[MEMORY.node].checked_shape().last
        vocabularies = {OPS[node.op].facts(node.attrs, node.inferred).get("vocab") for node in self.graph}
        return "[B, S, vocab] logits." if width in vocabularies else f"[B, S, {width}] states."


def _untied(statement: pyast.stmt) -> pyast.stmt:
    """A statement of `tie_weights()` giving the tied tensor a parameter of its own instead, as its module's
    constructor did: `self.a.weight = nn.Parameter(torch.empty_like(owner))`."""
    for node in pyast.walk(statement):
        untied = isinstance(node, pyast.For)  # a loop that unties each layer's
        if isinstance(node, pyast.Assign) and isinstance(node.targets[0], pyast.Attribute):
            node.value = call("nn.Parameter", call("torch.empty_like", node.value))
            untied = True
        note = note_of(node)
        if note is not None and note.text.startswith("tie, "):  # `shared = ...` names the spec line alone
            noted(node, note.text.replace("tie, ", "untied, " if untied else "", 1))
    return statement


def _dependency_order(derived: dict[str, tuple[pyast.expr, list[str]]]) -> list[str]:
    """The computed fields, each after the computed fields it reads."""
    order: list[str] = []

    def visit(name: str, seen: tuple[str, ...]) -> None:
        if name in order or name in seen:
            return
        for read in derived[name][1]:
            if read in derived:
                visit(read, (*seen, name))
        order.append(name)

    for name in derived:
        visit(name, ())
    return order


def _stack_sizes(instance: Instance) -> dict[str, int]:
    """Every repeated stack under `instance`: its path and its number of layers."""
    sizes: dict[str, int] = {}
    pending = [instance]
    while pending:
        node = pending.pop()
        if node.kind == "stack":
            sizes[node.path] = len(node.children)
        pending += node.children.values()
    return sizes


def _without_rate(parameter: str) -> str:
    """`dropout` of `dropout_rate`, `hidden_dropout` of `hidden_dropout_prob`; other names as they are."""
    for suffix in RATE_SUFFIXES:
        if parameter.endswith(suffix) and len(parameter) > len(suffix):
            return parameter.removesuffix(suffix)
    return parameter


def _attribute(path: str, owner: str = "self") -> pyast.expr:
    """`decoder.layers.0.embed.weight` -> `self.decoder.layers[0].embed.weight`."""
    code: pyast.expr = variable(owner)
    for part in path.split("."):
        code = pyast.Subscript(code, constant(int(part)), pyast.Load()) if part.isdigit() else attribute(code, part)
    return code
