/* opsmith's native Autograd kernels: the Autograd key of an opsmith op with no Python in the call.

   One small torch C++ library per torch version (built once through the torch-extension
   profile: the precompiled torch header, the normal store; see opsmith/_torch/_autograd_native.py).
   Python describes each op once (osm_ag_register): which arguments are tensors, what the
   backward op receives (output gradients, inputs, outputs, "does input i need a gradient")
   and which input each of its results is the gradient of. The kernel registered for the op's
   Autograd key then does what torch's generated VariableType kernels do:

   - no gradient needed (grad mode off, or no tensor input requires grad): redispatch below
     Autograd, straight to the CUDA/CPU kernel (the C-shim boxed kernel for kernel ops);
   - a gradient needed: make a backward node with the inputs' edges, save what the backward
     takes, redispatch below Autograd, attach the outputs to the node. Its apply() calls the
     backward op through the dispatcher (so a differentiable backward op gives double
     backward, and torch.compile/AOTAutograd trace it like any op).

   torch moved autograd nodes from std::shared_ptr to c10::intrusive_ptr (2.12); NodePtr below
   is whichever this torch uses. */
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/library.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;
using NodePtr = std::decay_t<decltype(std::declval<Node &>().getptr())>;

// what an argument of the op is
enum { A_TENSOR = 0, A_OPTIONAL_TENSOR = 1, A_OTHER = 2 };
// what an argument of the backward op receives
enum { B_GRAD = 0, B_INPUT = 1, B_OUTPUT = 2, B_NEEDS = 3 };

struct Spec {
    std::string name;                 // "ns::op", for messages and the node's name
    int n_args = 0, n_outs = 0;
    std::vector<int> arg_kind;        // per op argument
    std::vector<int> edge_of;         // op argument -> edge index (-1: not a tensor)
    int n_edges = 0;
    std::vector<int> bkind, bindex;   // per backward argument
    std::vector<char> grad_used;      // per output: the backward takes its gradient
    std::vector<int> grads_of;        // backward result j is the gradient of op argument grads_of[j] (-1: none)
    bool has_backward = false;
    c10::OperatorHandle backward;     // valid when has_backward
    std::string refuse;               // the message of an op that is not differentiable
    // what the node keeps: one slot per B_INPUT/B_OUTPUT backward argument
    std::vector<int> saved_slot;      // backward argument -> slot (-1 for grads and needs)
    int n_saved = 0;
    explicit Spec(c10::OperatorHandle bw) : backward(std::move(bw)) {}
};

template <class T, class P = NodePtr, class... A>
P make_node(A &&...a) {
    if constexpr (std::is_same_v<P, std::shared_ptr<Node>>) {
        return P(std::make_shared<T>(std::forward<A>(a)...));
    } else {
        return P(c10::make_intrusive<T>(std::forward<A>(a)...));
    }
}

bool differentiable(const at::Tensor &t) { return torch::autograd::isDifferentiableType(t.scalar_type()); }

struct OsmBackward : Node {
    std::shared_ptr<const Spec> spec;
    std::vector<SavedVariable> saved;      // tensor slots
    std::vector<c10::IValue> values;       // non-tensor slots (and None)
    std::vector<char> is_tensor;
    std::vector<char> attached;            // per output: has this node's history (else its gradient stays undefined)

    explicit OsmBackward(std::shared_ptr<const Spec> s) : spec(std::move(s)) {
        saved.resize(spec->n_saved);
        values.resize(spec->n_saved);
        is_tensor.assign(spec->n_saved, 0);
    }

    std::string name() const override { return spec->name + "Backward"; }

    void keep(int slot, const c10::IValue &v, bool is_output) {
        if (v.isTensor() && v.toTensor().defined()) {
            saved[slot] = SavedVariable(v.toTensor(), is_output);
            is_tensor[slot] = 1;
        } else {
            values[slot] = v.isTensor() ? c10::IValue() : v;  // an undefined tensor is None
        }
    }

    void release_variables() override {
        for (auto &s : saved) s.reset_data();
    }

    variable_list apply(variable_list &&grads) override {
        const Spec &s = *spec;
        for (size_t i = 0; i < grads.size(); i++)  // as torch.autograd.Function: zeros for the unused outputs it takes
            if (!grads[i].defined() && i < attached.size() && attached[i] && s.grad_used[i])
                grads[i] = input_metadata(i).zeros_like();
        torch::jit::Stack stack;
        stack.reserve(s.bkind.size());
        auto self = getptr();
        for (size_t a = 0; a < s.bkind.size(); a++) {
            switch (s.bkind[a]) {
            case B_GRAD: stack.emplace_back(grads.at(s.bindex[a])); break;
            case B_NEEDS: {
                int e = s.edge_of[s.bindex[a]];
                stack.emplace_back(e >= 0 && task_should_compute_output(e));
                break;
            }
            default: {
                int slot = s.saved_slot[a];
                if (is_tensor[slot]) stack.emplace_back(saved[slot].unpack(self));
                else stack.push_back(values[slot]);
            }
            }
        }
        s.backward.callBoxed(&stack);
        variable_list out(s.n_edges);
        size_t n = stack.size();
        if (n == 1 && stack[0].isTuple()) {  // a backward that returns one tuple
            auto elems = stack[0].toTupleRef().elements().vec();
            stack.assign(elems.begin(), elems.end());
            n = stack.size();
        }
        // registration checked that the backward op returns at most one Tensor per gradient slot
        for (size_t j = 0; j < n && j < s.grads_of.size(); j++) {
            int arg = s.grads_of[j];
            if (arg < 0) continue;
            int e = s.edge_of[arg];
            if (e < 0 || !task_should_compute_output(e)) continue;
            if (stack[j].isTensor()) out[e] = stack[j].toTensor();
        }
        return out;
    }
};

struct OsmAutograd : c10::OperatorKernel {
    std::shared_ptr<const Spec> spec;
    explicit OsmAutograd(std::shared_ptr<const Spec> s) : spec(std::move(s)) {}

    void operator()(const c10::OperatorHandle &op, c10::DispatchKeySet ks, torch::jit::Stack *stack) {
        const Spec &s = *spec;
        const size_t base = stack->size() - s.n_args;
        bool need = false;
        if (at::GradMode::is_enabled()) {
            for (int i = 0; i < s.n_args && !need; i++) {
                if (s.arg_kind[i] == A_OTHER) continue;
                const c10::IValue &v = (*stack)[base + i];
                need = v.isTensor() && v.toTensor().defined() && v.toTensor().requires_grad();
            }
        }
        if (!need) {
            at::AutoDispatchBelowAutograd guard;
            op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
            return;
        }
        // the edges, in op-argument order (an undefined/None tensor gives an empty edge)
        torch::autograd::edge_list edges;
        edges.reserve(s.n_edges);
        for (int i = 0; i < s.n_args; i++) {
            if (s.arg_kind[i] == A_OTHER) continue;
            const c10::IValue &v = (*stack)[base + i];
            if (v.isTensor() && v.toTensor().defined())
                edges.push_back(torch::autograd::impl::gradient_edge(v.toTensor()));
            else
                edges.emplace_back();
        }
        NodePtr node;
        OsmBackward *bw = nullptr;
        if (s.has_backward) {
            node = make_node<OsmBackward>(spec);
            bw = static_cast<OsmBackward *>(node.get());
            node->set_next_edges(std::move(edges));
            for (size_t a = 0; a < s.bkind.size(); a++)
                if (s.bkind[a] == B_INPUT) bw->keep(s.saved_slot[a], (*stack)[base + s.bindex[a]], false);
        } else {
            node = make_node<torch::autograd::Error>(s.refuse, std::move(edges));
        }
        {
            at::AutoDispatchBelowAutograd guard;
            op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
        }
        const size_t out_base = stack->size() - s.n_outs;
        for (int k = 0; k < s.n_outs; k++) {
            const c10::IValue &v = (*stack)[out_base + k];
            // an output whose gradient the backward does not take gets no history (torch's
            // output_differentiability: native_layer_norm's mean and rstd): a loss on it would
            // otherwise have its gradient dropped without a word
            bool attach = v.isTensor() && v.toTensor().defined() && differentiable(v.toTensor()) &&
                          (!bw || s.grad_used[k]);
            if (attach)
                torch::autograd::set_history(v.toTensor(), node);
            else
                node->add_input_metadata(Node::undefined_input());
            if (bw) bw->attached.push_back(attach);
        }
        if (bw)  // outputs are saved after their history is set, as torch's own kernels do
            for (size_t a = 0; a < s.bkind.size(); a++)
                if (s.bkind[a] == B_OUTPUT) bw->keep(s.saved_slot[a], (*stack)[out_base + s.bindex[a]], true);
    }
};

std::mutex registry_lock;
std::vector<std::unique_ptr<torch::Library>> registry;  // alive as long as the process: the registrations

void put_error(char *err, int len, const std::string &what) {
    if (err && len > 0) snprintf(err, (size_t)len, "%s", what.c_str());
}

}  // namespace

extern "C" {
__attribute__((visibility("default"))) int osm_ag_abi(void) { return 1; }

/* Register the Autograd kernel of ns::name (its default overload).
   arg_kind: n_args entries (A_*); bkind/bindex: n_bargs entries (B_*: output gradient k, op
   argument i, output k, needs-gradient of argument i); grads_of: n_results entries.
   backward: "ns::op" of the backward op (its default overload), or NULL with `refuse` the
   message of an op that is not differentiable. Returns 0, or 1 with the reason in err. */
__attribute__((visibility("default"))) int osm_ag_register(
        const char *ns, const char *name, int n_args, const int *arg_kind, int n_outs, const char *backward,
        const char *refuse, int n_bargs, const int *bkind, const int *bindex, int n_results, const int *grads_of,
        char *err, int err_len) {
    try {
        std::string qual = std::string(ns) + "::" + name;
        auto &dispatcher = c10::Dispatcher::singleton();
        auto op = dispatcher.findSchema({qual, ""});
        if (!op) {
            put_error(err, err_len, qual + " is not a defined op");
            return 1;
        }
        c10::OperatorHandle bw_handle = *op;
        bool has_backward = backward != nullptr;
        if (has_backward) {
            auto bw = dispatcher.findSchema({backward, ""});
            if (!bw) {
                put_error(err, err_len, std::string("the backward op ") + backward + " is not a defined op");
                return 1;
            }
            bw_handle = *bw;
            const auto &rets = bw_handle.schema().returns();
            if (rets.size() > (size_t)n_results) {
                put_error(err, err_len, std::string("its backward ") + backward + " returns " + std::to_string(rets.size()) +
                          " gradients for " + std::to_string(n_results) + " inputs; return one per input");
                return 1;
            }
            for (const auto &r : rets)
                if (r.type()->kind() != c10::TypeKind::TensorType) {
                    put_error(err, err_len, std::string("its backward ") + backward + " returns a " + r.type()->str() +
                              "; gradients are Tensors");
                    return 1;
                }
        }
        auto spec = std::make_shared<Spec>(bw_handle);
        spec->name = qual;
        spec->has_backward = has_backward;
        spec->refuse = refuse ? refuse : "";
        spec->n_args = n_args;
        spec->n_outs = n_outs;
        spec->arg_kind.assign(arg_kind, arg_kind + n_args);
        spec->edge_of.assign(n_args, -1);
        for (int i = 0; i < n_args; i++)
            if (arg_kind[i] != A_OTHER) spec->edge_of[i] = spec->n_edges++;
        spec->bkind.assign(bkind, bkind + n_bargs);
        spec->bindex.assign(bindex, bindex + n_bargs);
        spec->saved_slot.assign(n_bargs, -1);
        spec->grad_used.assign(n_outs, 0);
        for (int a = 0; a < n_bargs; a++) {
            int lim = bkind[a] == B_OUTPUT ? n_outs : (bkind[a] == B_GRAD ? n_outs : n_args);
            if (bindex[a] < 0 || bindex[a] >= lim || bkind[a] < B_GRAD || bkind[a] > B_NEEDS) {
                put_error(err, err_len, qual + ": backward argument " + std::to_string(a) + " is out of range");
                return 1;
            }
            if (bkind[a] == B_INPUT || bkind[a] == B_OUTPUT) spec->saved_slot[a] = spec->n_saved++;
            if (bkind[a] == B_GRAD) spec->grad_used[bindex[a]] = 1;
        }
        spec->grads_of.assign(grads_of, grads_of + n_results);
        for (int j = 0; j < n_results; j++)
            if (grads_of[j] >= n_args) {
                put_error(err, err_len, qual + ": a gradient names argument " + std::to_string(grads_of[j]));
                return 1;
            }
        std::lock_guard<std::mutex> guard(registry_lock);
        auto lib = std::make_unique<torch::Library>(torch::Library::IMPL, std::string(ns),
                                                    std::optional<c10::DispatchKey>(c10::DispatchKey::Autograd),
                                                    "opsmith/_torch/autograd/osm_autograd.cpp", 0);
        lib->impl(name, torch::CppFunction::makeFromBoxedFunctor(
                            std::make_unique<OsmAutograd>(std::shared_ptr<const Spec>(spec))));
        registry.push_back(std::move(lib));
        return 0;
    } catch (const std::exception &e) {
        put_error(err, err_len, e.what());
        return 1;
    }
}
}
