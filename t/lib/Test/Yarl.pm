package Test::Yarl;

# A small harness in the style of nginx-tests' Test::Nginx, on Perl core modules only:
# runs the vendored nginx with our module from a heredoc configuration, runs yarl-root,
# talks HTTP, and fails the test when error.log has [alert], [crit] or [emerg] lines.
#
# Environment:
#   TEST_NGINX_BINARY  nginx to run (the vendored build: target/<profile>/build/nginx-sys-*/out/objs/nginx)
#   TEST_YARL_MODULE   path of ngx_http_yarl_module.so
#   TEST_YARL_ROOT     path of the yarl-root binary (tests that need a root)
#   TEST_YARL_S3_APP   path of the yarl-s3-app binary (tests of the S3 example application)
#   TEST_YARL_LEAVE    keep the test directory (printed as a diagnostic)
#   TEST_NGINX_GLOBALS       extra main-context directives for %%TEST_GLOBALS%%, and
#   TEST_NGINX_GLOBALS_HTTP  extra http-context directives for %%TEST_GLOBALS_HTTP%%, as in
#                            nginx-tests; %%TESTDIR%% in them is the test directory (used
#                            by `make distro-test` to keep an installed nginx's compiled-in
#                            paths out of the run)
#
# The generated globals already put everything a run writes under the test directory (pid,
# error_log, access_log, temp paths; `user root` when run as root), so an nginx with
# compiled-in system paths (a distribution's /usr/sbin/nginx) runs as well as the vendored one.

use warnings;
use strict;

use Exporter qw(import);
use File::Spec;
use File::Temp qw(tempdir);
use IO::Socket::INET;
use HTTP::Tiny;
use JSON::PP ();
use POSIX qw(:sys_wait_h);
use Test::More;
use Time::HiRes qw(sleep time);

our @EXPORT_OK = qw(http_get http_request status_of header_of body_of);

my $JSON = JSON::PP->new->canonical->allow_nonref;

sub new {
	my ($class) = @_;
	for my $var (qw(TEST_NGINX_BINARY TEST_YARL_MODULE)) {
		BAIL_OUT("$var is not set") unless $ENV{$var};
		BAIL_OUT("$var=$ENV{$var} does not exist") unless -e $ENV{$var};
	}
	# load_module resolves a relative path against the test prefix, not the current directory.
	$ENV{TEST_YARL_MODULE} = File::Spec->rel2abs($ENV{TEST_YARL_MODULE});
	my $dir = tempdir('yarl-test-XXXXXX', TMPDIR => 1, CLEANUP => !$ENV{TEST_YARL_LEAVE});
	diag("test directory: $dir") if $ENV{TEST_YARL_LEAVE};
	mkdir "$dir/html";
	# nginx opens its compiled-in error log under the prefix before reading the configuration.
	mkdir "$dir/logs";
	my $self = bless {
		dir => $dir, ports => {}, nginx_pid => undef, roots => {}, apps => {}, daemons => [],
	}, $class;
	return $self;
}

sub testdir { $_[0]{dir} }

# A free loopback port for the symbolic port $n (%%PORT_n%% in configurations).
sub port {
	my ($self, $n) = @_;
	return $self->{ports}{$n} if $self->{ports}{$n};
	for (1 .. 50) {
		my $s = IO::Socket::INET->new(
			Listen => 1, LocalAddr => '127.0.0.1', LocalPort => 0, Proto => 'tcp', ReuseAddr => 1,
		) or next;
		my $p = $s->sockport;
		close $s;
		next if grep { $_ == $p } values %{$self->{ports}};
		return $self->{ports}{$n} = $p;
	}
	die "no free port\n";
}

sub write_file {
	my ($self, $name, $content) = @_;
	open my $fh, '>', "$self->{dir}/$name" or die "cannot write $name: $!\n";
	binmode $fh;
	print $fh $content;
	close $fh;
}

sub read_file {
	my ($self, $name) = @_;
	open my $fh, '<', "$self->{dir}/$name" or return '';
	local $/;
	my $c = <$fh>;
	close $fh;
	return $c;
}

sub globals {
	my ($self) = @_;
	my $s = "load_module $ENV{TEST_YARL_MODULE};\n";
	$s .= "pid $self->{dir}/nginx.pid;\n";
	$s .= "error_log $self->{dir}/error.log notice;\n";
	# Workers as root read the 0700 test directory.
	$s .= "user root;\n" if $> == 0;
	$s .= "$ENV{TEST_NGINX_GLOBALS}\n" if $ENV{TEST_NGINX_GLOBALS};
	return $s;
}

sub globals_http {
	my ($self) = @_;
	my $d = $self->{dir};
	return "access_log $d/access.log;\n"
		. "client_body_temp_path $d/client_body_temp;\n"
		. "proxy_temp_path $d/proxy_temp;\n"
		. "fastcgi_temp_path $d/fastcgi_temp;\n"
		. "uwsgi_temp_path $d/uwsgi_temp;\n"
		. "scgi_temp_path $d/scgi_temp;\n"
		. ($ENV{TEST_NGINX_GLOBALS_HTTP} ? "$ENV{TEST_NGINX_GLOBALS_HTTP}\n" : '');
}

sub expand {
	my ($self, $conf) = @_;
	$conf =~ s/%%TEST_GLOBALS%%/$self->globals()/ge;
	$conf =~ s/%%TEST_GLOBALS_HTTP%%/$self->globals_http()/ge;
	$conf =~ s/%%TESTDIR%%/$self->{dir}/g;
	$conf =~ s/%%PORT_(\w+)%%/$self->port($1)/ge;
	$conf =~ s/%%ROOT_(\w+)%%/$self->root_url($1)/ge;
	return $conf;
}

# Writes nginx.conf (or $name) with the substitutions applied.
sub write_file_expand {
	my ($self, $name, $content) = @_;
	$self->write_file($name, $self->expand($content));
	return $self;
}

# The nginx.conf of a test, before the substitutions: %%TEST_GLOBALS%%, an events block and
# an http block that starts with %%TEST_GLOBALS_HTTP%% and goes on with $http, the test's
# own http-level configuration. Options:
#   workers => N    worker_processes N (nginx's default, 1, without it)
#   main => TEXT    further main-context directives, after worker_processes
#   events => TEXT  the events block's content (empty by default)
sub http_conf {
	my ($self, $http, %opt) = @_;
	my %known = map { $_ => 1 } qw(workers main events);
	my @unknown = grep { !$known{$_} } sort keys %opt;
	die "http_conf: unknown option(s) @unknown\n" if @unknown;
	$http .= "\n" unless $http =~ /\n\z/;
	my $conf = "%%TEST_GLOBALS%%\n";
	$conf .= "worker_processes $opt{workers};\n" if defined $opt{workers};
	$conf .= "$opt{main}\n" if defined $opt{main};
	$conf .= 'events { ' . (defined $opt{events} ? "$opt{events} " : '') . "}\n";
	$conf .= "http {\n    %%TEST_GLOBALS_HTTP%%\n$http}\n";
	return $conf;
}

# Writes nginx.conf from http_conf($http, %opt), with the substitutions applied.
sub write_http_conf {
	my ($self, $http, %opt) = @_;
	return $self->write_file_expand('nginx.conf', $self->http_conf($http, %opt));
}

sub nginx_cmd {
	my ($self, @args) = @_;
	return ($ENV{TEST_NGINX_BINARY}, '-p', "$self->{dir}/", '-c', "$self->{dir}/nginx.conf", @args);
}

# `nginx -t` on nginx.conf: (exit status, combined output).
sub test_config {
	my ($self) = @_;
	my @cmd = $self->nginx_cmd('-t');
	my $out = '';
	my $pid = open(my $fh, '-|') // die "fork: $!\n";
	if (!$pid) {
		open STDERR, '>&', \*STDOUT;
		exec @cmd or POSIX::_exit(127);
	}
	local $/;
	$out = <$fh> // '';
	close $fh;
	return ($? >> 8, $out);
}

# Starts nginx (in the foreground of a child process) and waits for the listed ports,
# every %%PORT_n%% of the configuration by default.
sub run {
	my ($self, @wait) = @_;
	my $conf = $self->read_file('nginx.conf');
	@wait = ($conf =~ /^\s*listen\s+127\.0\.0\.1:(\d+)/mg) unless @wait;
	my $pid = fork() // die "fork: $!\n";
	if (!$pid) {
		open STDOUT, '>>', "$self->{dir}/stderr.log";
		open STDERR, '>>', "$self->{dir}/stderr.log";
		exec($self->nginx_cmd('-g', 'daemon off;')) or POSIX::_exit(127);
	}
	$self->{nginx_pid} = $pid;
	for my $p (@wait) {
		$self->wait_port($p) or do {
			diag($self->read_file('error.log') . $self->read_file('stderr.log'));
			die "nginx did not start listening on $p\n";
		};
	}
	$self->wait_workers();
	return $self;
}

sub master_pid { $_[0]{nginx_pid} }

# Pids of the master's children that are workers.
sub worker_pids {
	my ($self) = @_;
	my $master = $self->{nginx_pid} or return ();
	my @pids;
	opendir(my $dh, '/proc') or return ();
	for my $p (grep { /^\d+$/ } readdir $dh) {
		open my $fh, '<', "/proc/$p/stat" or next;
		my $stat = <$fh> // '';
		close $fh;
		next unless $stat =~ /^\d+ \((.*)\) \S+ (\d+)/ && $2 == $master;
		open my $cl, '<', "/proc/$p/cmdline" or next;
		my $cmd = <$cl> // '';
		push @pids, $p if $cmd =~ /worker process/ && $cmd !~ /shutting down/;
	}
	return sort { $a <=> $b } @pids;
}

# Names of the threads of process $pid.
sub thread_names {
	my ($self, $pid) = @_;
	opendir(my $dh, "/proc/$pid/task") or return ();
	my @names;
	for my $t (grep { /^\d+$/ } readdir $dh) {
		open my $fh, '<', "/proc/$pid/task/$t/comm" or next;
		chomp(my $n = <$fh> // '');
		push @names, $n;
	}
	return @names;
}

sub worker_count {
	my ($self) = @_;
	my ($n) = $self->read_file('nginx.conf') =~ /^\s*worker_processes\s+(\d+)/m;
	return $n // 1;
}

sub wait_workers {
	my ($self, $exclude) = @_;
	my %old = map { $_ => 1 } @{$exclude // []};
	my $want = $self->worker_count;
	return $self->wait_for(sub { (grep { !$old{$_} } $self->worker_pids) >= $want }, 10);
}

# `nginx -s reload`, then waits until a fresh set of workers runs.
sub reload {
	my ($self) = @_;
	my @old = $self->worker_pids;
	kill 'HUP', $self->{nginx_pid};
	return $self->wait_workers(\@old);
}

sub wait_port {
	my ($self, $port, $timeout) = @_;
	return $self->wait_for(sub {
		my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 1);
		return $s ? (close($s), 1) : 0;
	}, $timeout // 10);
}

# Polls $cond every 50 ms for at most $timeout seconds; true once it held.
sub wait_for {
	my ($self, $cond, $timeout) = @_;
	my $end = time() + ($timeout // 5);
	while (time() < $end) {
		return 1 if $cond->();
		sleep 0.05;
	}
	return $cond->() ? 1 : 0;
}

# Graceful stop (SIGQUIT, as `nginx -s quit`); true when nginx exited by itself in time.
sub stop_nginx {
	my ($self) = @_;
	my $pid = delete $self->{nginx_pid} or return 1;
	kill 'QUIT', $pid;
	my $ok = $self->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, 15);
	unless ($ok) {
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
	return $ok;
}

sub has_root {
	return $ENV{TEST_YARL_ROOT} && -x $ENV{TEST_YARL_ROOT};
}

# Starts the root server $name on a free port with its own sqlite database (unless @extra
# names another with --db).
sub run_root {
	my ($self, $name, @extra) = @_;
	my @db = grep({ $_ eq '--db' } @extra) ? () : ('--db', "sqlite://$self->{dir}/yarl_$name.db");
	my @poll = grep({ $_ eq '--poll-interval' } @extra) ? () : ('--poll-interval', '200ms');
	$name //= 'A';
	BAIL_OUT('TEST_YARL_ROOT is not set or not executable') unless has_root();
	my $port = $self->port("ROOT_$name");
	my $pid = fork() // die "fork: $!\n";
	if (!$pid) {
		open STDOUT, '>>', "$self->{dir}/root_$name.log";
		open STDERR, '>>', "$self->{dir}/root_$name.log";
		exec($ENV{TEST_YARL_ROOT}, '--listen', "127.0.0.1:$port",
			@db, @poll, @extra)
			or POSIX::_exit(127);
	}
	$self->{roots}{$name} = $pid;
	$self->wait_port($port, 20) or do {
		diag($self->read_file("root_$name.log"));
		die "yarl-root $name did not start\n";
	};
	return $self;
}

sub stop_root {
	my ($self, $name) = @_;
	my $pid = delete $self->{roots}{$name // 'A'} or return;
	kill 'TERM', $pid;
	unless ($self->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, 10)) {
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
}

# Makes %%ROOT_n%% in this instance's configurations name the roots that $other runs, so
# two nginx (two Test::Yarl objects) can sync with the same roots.
sub use_roots_of {
	my ($self, $other) = @_;
	$self->{ports}{$_} = $other->{ports}{$_} for grep { /^ROOT_/ } keys %{$other->{ports}};
	return $self;
}

sub has_app {
	return $ENV{TEST_YARL_S3_APP} && -x $ENV{TEST_YARL_S3_APP};
}

# Starts the S3 application (examples/s3-app) on the free port for the symbolic port $n,
# syncing with root $root every 200 ms; one JSON line per request in app_$n.log.
sub run_app {
	my ($self, $n, $root, @extra) = @_;
	BAIL_OUT('TEST_YARL_S3_APP is not set or not executable') unless has_app();
	my $port = $self->port($n);
	my $pid = fork() // die "fork: $!\n";
	if (!$pid) {
		open STDOUT, '>>', "$self->{dir}/app_$n.log";
		open STDERR, '>>', "$self->{dir}/app_$n.err";
		exec($ENV{TEST_YARL_S3_APP}, '--listen', "127.0.0.1:$port",
			'--root', $self->root_url($root // 'A'), '--sync-interval', '200ms',
			'--access-log', @extra)
			or POSIX::_exit(127);
	}
	$self->{apps}{$n} = $pid;
	$self->wait_port($port, 20) or do {
		diag($self->read_file("app_$n.err"));
		die "yarl-s3-app did not start\n";
	};
	return $self;
}

# Stops the application on symbolic port $n (SIGTERM: a last sync, then exit); true when it
# exited by itself in time.
sub stop_app {
	my ($self, $n) = @_;
	my $pid = delete $self->{apps}{$n} or return 1;
	kill 'TERM', $pid;
	my $ok = $self->wait_for(sub { waitpid($pid, WNOHANG) == $pid }, 10);
	unless ($ok) {
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
	return $ok;
}

# The application's requests so far (its access log), decoded.
sub app_log {
	my ($self, $n) = @_;
	return map { $JSON->decode($_) } grep { /\S/ } split /\n/, $self->read_file("app_$n.log");
}

sub root_url {
	my ($self, $name) = @_;
	return 'http://127.0.0.1:' . $self->port("ROOT_$name");
}

# Admin API calls; return (status, decoded body or raw text).
sub admin {
	my ($self, $method, $path, $body, $root) = @_;
	my $url = $self->root_url($root // 'A') . $path;
	my $res = HTTP::Tiny->new(timeout => 5)->request($method, $url, {
		headers => { 'Content-Type' => 'application/json' },
		defined $body ? (content => $JSON->encode($body)) : (),
	});
	my $content = $res->{content} // '';
	my $decoded = eval { $JSON->decode($content) } // $content;
	return ($res->{status}, $decoded);
}

# Creates or replaces quota $name: put_quota(name, limit, low, high[, parent]).
sub put_quota {
	my ($self, $name, $limit, $low, $high, $parent, $root) = @_;
	my ($status, $body) = $self->admin('PUT', "/v1/quotas/$name", {
		limit => $limit, low_burst => $low, high_burst => $high, parent => $parent,
	}, $root);
	die "PUT /v1/quotas/$name: $status " . (ref $body ? $JSON->encode($body) : $body) . "\n"
		unless $status == 200 || $status == 201;
	return $body;
}

sub delete_quota {
	my ($self, $name, $root) = @_;
	my ($status) = $self->admin('DELETE', "/v1/quotas/$name", undef, $root);
	die "DELETE /v1/quotas/$name: $status\n" unless $status =~ /^2/;
}

# The decoded yarl_stats page at http://127.0.0.1:$port$path.
sub stats {
	my ($self, $port, $path) = @_;
	my $r = http_get($port, $path // '/stats');
	my $b = body_of($r);
	return eval { $JSON->decode($b) };
}

# Waits until the worker serving $port$path holds quota $name (or no longer does with
# $gone); true on success.
sub wait_quota {
	my ($self, $port, $name, $timeout, $gone, $path) = @_;
	return $self->wait_for(sub {
		my $s = $self->stats($port, ($path // '/stats') . "?quota=$name") or return 0;
		return $gone ? !defined $s->{quota} : defined $s->{quota};
	}, $timeout // 5);
}

sub decode_json { $JSON->decode($_[1]) }

# The root's /metrics as { 'name{labels}' => value }.
sub root_metrics {
	my ($self, $root) = @_;
	my $res = HTTP::Tiny->new(timeout => 5)->get($self->root_url($root // 'A') . '/metrics');
	my %m;
	for (split /\n/, $res->{content} // '') {
		next if /^#/;
		$m{$1} = $2 if /^(\S+)\s+(\S+)$/;
	}
	return \%m;
}

# Names of the threads called yarl-sync in every worker, and in the master.
sub sync_threads {
	my ($self) = @_;
	my %per = map { $_ => scalar(grep { $_ eq 'yarl-sync' } $self->thread_names($_)) }
		$self->worker_pids;
	my $master = grep { $_ eq 'yarl-sync' } $self->thread_names($self->master_pid);
	return (\%per, $master);
}

# error.log lines matching $re are expected, not failures of finish().
sub allow_alerts {
	my ($self, $re) = @_;
	push @{$self->{allowed_alerts}}, $re;
	return $self;
}

# Stops everything and checks the logs: call once at the end of every test file.
sub finish {
	my ($self) = @_;
	my $clean = $self->stop_nginx();
	ok($clean, 'nginx exited gracefully');
	for my $n (sort keys %{$self->{apps}}) {
		ok($self->stop_app($n), "yarl-s3-app $n exited gracefully");
		unlike($self->read_file("app_$n.err"), qr/panick/, "yarl-s3-app $n did not panic");
	}
	$self->stop_root($_) for keys %{$self->{roots}};
	my @allowed = @{$self->{allowed_alerts} // []};
	my @bad = grep {
		my $line = $_;
		/\[(alert|crit|emerg)\]/ && !grep { $line =~ $_ } @allowed
	} split /\n/, $self->read_file('error.log');
	is(join("\n", @bad), '', 'no alerts in error.log');
	my $stderr = $self->read_file('stderr.log');
	unlike($stderr, qr/panick/, 'no panics');
	$self->{finished} = 1;
}

sub DESTROY {
	my ($self) = @_;
	local $?;
	if (my $pid = delete $self->{nginx_pid}) {
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
	for my $pid (values %{$self->{apps}}, values %{$self->{roots}}) {
		kill 'KILL', $pid;
		waitpid($pid, 0);
	}
}

############################################################################
# HTTP client, nginx-tests style: raw requests over IO::Socket::INET.

sub http_get {
	my ($port, $path, %headers) = @_;
	return http_request('GET', $port, $path, \%headers);
}

sub http_request {
	my ($method, $port, $path, $headers, $body) = @_;
	my $s = IO::Socket::INET->new(PeerAddr => "127.0.0.1:$port", Timeout => 5) or return '';
	my $req = "$method $path HTTP/1.1\r\nConnection: close\r\n";
	$req .= "Host: localhost\r\n" unless grep { lc eq 'host' } keys %{$headers // {}};
	for my $k (sort keys %{$headers // {}}) {
		$req .= "$k: $headers->{$k}\r\n";
	}
	$req .= 'Content-Length: ' . length($body) . "\r\n" if defined $body;
	$req .= "\r\n";
	$req .= $body if defined $body;
	$s->print($req);
	local $/;
	my $resp = '';
	eval {
		local $SIG{ALRM} = sub { die "timeout\n" };
		alarm 10;
		$resp = <$s> // '';
		alarm 0;
	};
	alarm 0;
	close $s;
	return $resp;
}

sub status_of {
	my ($r) = @_;
	return ($r // '') =~ m{^HTTP/1\.[01] (\d{3})} ? $1 : 0;
}

sub header_of {
	my ($r, $name) = @_;
	my ($head) = split /\r\n\r\n/, $r // '', 2;
	return ($head // '') =~ /^\Q$name\E:\s*(.*?)\r?$/mi ? $1 : undef;
}

sub body_of {
	my ($r) = @_;
	my (undef, $body) = split /\r\n\r\n/, $r // '', 2;
	return $body // '';
}

1;
